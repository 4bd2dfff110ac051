//! One job-lane mechanism for every background lane (memory, summary): reap orphaned
//! jobs, claim one under the per-user running index, run it, record how it ended. A lane
//! supplies its statements (from `sql/<area>/job_*.sql`), its job row and its work; the
//! loop, the race and error rules and the outcome are the same for all, so a new lane
//! cannot get them subtly different.

use std::future::Future;

use serde::Serialize;
use serde_json::{json, Value};
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::QueryAs;
use sqlx::{PgPool, Postgres};

/// A lane job's outcome, whichever lane ran it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// Nothing queued.
    Empty,
    /// Another worker claimed the same user's job at the same moment; try again.
    Busy,
    Done {
        job_id: i64,
        kind: String,
        result: serde_json::Value,
    },
    Failed {
        job_id: i64,
        kind: String,
        error: String,
    },
    /// The job's user, character or session was erased while it ran; what it wrote was
    /// erased again.
    Erased { job_id: i64 },
}

/// A claimed job row, as the lane's claim statement returns it.
pub trait Job: for<'r> sqlx::FromRow<'r, PgRow> + Send + Sync + Unpin {
    fn id(&self) -> i64;
    fn kind(&self) -> &str;
    /// The user and character the job works for: what an erase that removed the job's
    /// row while it ran erases again once the job ends.
    fn owner(&self) -> (&str, Option<i64>);
}

/// The lane's claim statement, for the lane to bind its parameters to.
pub type Claim<'q, J> = QueryAs<'q, Postgres, J, PgArguments>;

/// How a job's work ended when it did not fail.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Done; the result goes on the job row.
    Done(Value),
    /// Ran too early: the job goes back to the queue, due at this time.
    Defer(chrono::DateTime<chrono::Utc>),
}

/// A background lane: its statements, its job row and its work.
pub trait Lane: Sync {
    type Job: Job;
    type Error: From<sqlx::Error> + std::fmt::Display + Send;
    /// The lane's name in log lines ("memory job failed").
    const NAME: &'static str;
    /// A running job older than this is taken to be orphaned and is run again.
    const STALE_SECS: f64;
    /// Queues again the jobs running longer than $1 seconds.
    const REAP_SQL: &'static str;
    /// Claims the next runnable job, or none; a racing claim is a unique violation.
    const CLAIM_SQL: &'static str;
    /// Records a job's end: $1 id, $2 state, $3 result, $4 error.
    const FINISH_SQL: &'static str;
    /// Queues a job again, due later: $1 id, $2 due time. Only lanes whose work defers.
    const DEFER_SQL: Option<&'static str> = None;

    fn pool(&self) -> &PgPool;
    /// Binds the claim's parameters (what this lane can run, the clock).
    fn bind_claim<'q>(&self, claim: Claim<'q, Self::Job>) -> Claim<'q, Self::Job>;
    /// The job's work; an error fails the job unless [`Lane::aborts`] says otherwise.
    fn work(&self, job: &Self::Job) -> impl Future<Output = Result<Step, Self::Error>> + Send;
    /// Whether an error fails the call instead of the job: the job stays running, and the
    /// reaper queues it again.
    fn aborts(_error: &Self::Error) -> bool {
        false
    }
    /// Called once a job's end is recorded (the lane's events).
    fn recorded(
        &self,
        _job: &Self::Job,
        _result: Option<&Value>,
        _error: Option<&str>,
    ) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// Claims and runs the lane's next job. Only database errors (and what the lane says
/// aborts) fail the call.
pub async fn run_next<L: Lane>(lane: &L) -> Result<Outcome, L::Error> {
    // A job left running by a dead worker would block its user's lane for good.
    sqlx::query(L::REAP_SQL)
        .bind(L::STALE_SECS)
        .execute(lane.pool())
        .await?;
    let claimed = lane
        .bind_claim(sqlx::query_as::<_, L::Job>(L::CLAIM_SQL))
        .fetch_optional(lane.pool())
        .await;
    let job = match claimed {
        Ok(Some(j)) => j,
        Ok(None) => return Ok(Outcome::Empty),
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => return Ok(Outcome::Busy),
        Err(e) => return Err(e.into()),
    };
    let (result, error) = match lane.work(&job).await {
        Ok(Step::Done(v)) => (Some(v), None),
        Ok(Step::Defer(due)) => match L::DEFER_SQL {
            Some(sql) => {
                sqlx::query(sql)
                    .bind(job.id())
                    .bind(due)
                    .execute(lane.pool())
                    .await?;
                return Ok(Outcome::Done {
                    job_id: job.id(),
                    kind: job.kind().to_string(),
                    result: json!({"deferred": true}),
                });
            }
            None => (
                None,
                Some(format!("the {} lane cannot defer a job", L::NAME)),
            ),
        },
        Err(e) if L::aborts(&e) => return Err(e),
        Err(e) => (None, Some(e.to_string())),
    };
    let state = if error.is_none() { "done" } else { "failed" };
    let finished = sqlx::query(L::FINISH_SQL)
        .bind(job.id())
        .bind(state)
        .bind(&result)
        .bind(&error)
        .execute(lane.pool())
        .await?;
    if finished.rows_affected() == 0 {
        // The row was erased while the job ran: what the job wrote since goes too, and
        // nothing about it is recorded.
        let (user, character) = job.owner();
        sqlx::query(include_str!("../sql/erase/late.sql"))
            .bind(user)
            .bind(character)
            .bind(L::STALE_SECS)
            .execute(lane.pool())
            .await?;
        return Ok(Outcome::Erased { job_id: job.id() });
    }
    lane.recorded(&job, result.as_ref(), error.as_deref()).await;
    let (job_id, kind) = (job.id(), job.kind().to_string());
    Ok(match error {
        None => Outcome::Done {
            job_id,
            kind,
            result: result.unwrap_or(Value::Null),
        },
        Some(error) => Outcome::Failed {
            job_id,
            kind,
            error,
        },
    })
}

/// Runs the lane's jobs until none is runnable; every outcome but the last `Empty`.
pub async fn drain<L: Lane>(lane: &L) -> Result<Vec<Outcome>, L::Error> {
    let mut out = Vec::new();
    loop {
        match run_next(lane).await? {
            Outcome::Empty => return Ok(out),
            o => out.push(o),
        }
    }
}

/// One step of the worker's idle lanes: runs the lane's next job if the lane is on; true
/// if it did work. Errors are logged (the lane goes on).
pub async fn step<L: Lane>(lane: Option<&L>) -> bool {
    let Some(lane) = lane else {
        return false;
    };
    match run_next(lane).await {
        Ok(Outcome::Empty) => false,
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(error = %e, "{} job failed", L::NAME);
            false
        }
    }
}
