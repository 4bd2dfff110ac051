//! The summary lane: session closes, rolling summaries, session summaries and spine
//! versions run as jobs in Postgres, ordered per user, due at a time, and taken only while
//! no turn generates, so summarising never delays a chat turn. Every job ends in an
//! `events` row saying what it made or why it failed.

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::lane::{self, Claim, Job, Lane, Step};

use super::compaction::MessageRow;
use super::llm::Prompt;
use super::schema::{self, SessionSummary};
use super::{clip, event, spine, Result, SummaryError, SummaryService};

/// A running summary job older than this is taken to be orphaned and is run again.
pub const STALE_JOB_SECS: f64 = 600.0;
/// Seed 001: the rolling summary is at most 600 characters.
pub const ROLLING_MAX_CHARS: usize = 600;
/// Dialogue lines a rolling summary reads beyond the previous one.
pub const ROLLING_LINES: i64 = 40;
/// Dialogue lines a session summary reads at most (the oldest go first if they do not fit).
pub const SESSION_LINES: i64 = 400;

/// A summary job's outcome: the one every lane reports.
pub use crate::lane::Outcome;

/// A claimed job, as `job_claim.sql` returns it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SummaryJob {
    id: i64,
    kind: String,
    user_id: String,
    character_id: Option<i64>,
    session_id: Option<i64>,
    payload: Value,
}

impl SummaryJob {
    /// Whether the payload has a `rebuild` key, whatever its value (`kvmem summary
    /// rebuild` sets it).
    fn is_rebuild(&self) -> bool {
        self.payload
            .as_object()
            .is_some_and(|o| o.contains_key("rebuild"))
    }
}

/// Claims and runs the next summary job due now.
pub async fn process_next_summary_job(svc: &SummaryService) -> Result<Outcome> {
    lane::run_next(&SummaryLane::now(svc)).await
}

/// Claims and runs the next summary job due at `now`: the clock is a parameter, so tests
/// move it instead of sleeping. Model failures fail the job (recorded, with an event);
/// only database errors fail the call.
pub async fn process_next_summary_job_at(
    svc: &SummaryService,
    now: DateTime<Utc>,
) -> Result<Outcome> {
    lane::run_next(&SummaryLane { svc, now }).await
}

impl Job for SummaryJob {
    fn id(&self) -> i64 {
        self.id
    }
    fn kind(&self) -> &str {
        &self.kind
    }
    fn owner(&self) -> (&str, Option<i64>) {
        (&self.user_id, self.character_id)
    }
}

/// The summary lane on the shared job-lane mechanism, as of a clock: a job is claimed
/// once due at `now`, closes first.
pub struct SummaryLane<'a> {
    pub svc: &'a SummaryService,
    pub now: DateTime<Utc>,
}

impl<'a> SummaryLane<'a> {
    /// The lane as of this moment (the worker's idle lane).
    pub fn now(svc: &'a SummaryService) -> Self {
        Self {
            svc,
            now: Utc::now(),
        }
    }
}

impl Lane for SummaryLane<'_> {
    type Job = SummaryJob;
    type Error = SummaryError;
    const NAME: &'static str = "summary";
    const STALE_SECS: f64 = STALE_JOB_SECS;
    const REAP_SQL: &'static str = include_str!("../../sql/summary/job_reap.sql");
    const CLAIM_SQL: &'static str = include_str!("../../sql/summary/job_claim.sql");
    const FINISH_SQL: &'static str = include_str!("../../sql/summary/job_finish.sql");
    const DEFER_SQL: Option<&'static str> = Some(include_str!("../../sql/summary/job_defer.sql"));

    fn pool(&self) -> &PgPool {
        &self.svc.pool
    }

    fn bind_claim<'q>(&self, claim: Claim<'q, SummaryJob>) -> Claim<'q, SummaryJob> {
        claim.bind(self.now)
    }

    async fn work(&self, job: &SummaryJob) -> Result<Step> {
        let (svc, now) = (self.svc, self.now);
        let done = match job.kind.as_str() {
            "close" => return close(svc, job, now).await,
            "rolling" => rolling(svc, job, now).await,
            "session" => session_summary(svc, job).await,
            "spine" => spine_version(svc, job).await,
            "compact" => compact(svc, job, now).await,
            "context" => user_context(svc, job, now).await,
            other => Err(SummaryError::Invalid(format!("unknown job kind {other}"))),
        };
        done.map(Step::Done)
    }

    /// A database error leaves the job running for the reaper: it says nothing of the job.
    fn aborts(error: &SummaryError) -> bool {
        matches!(error, SummaryError::Db(_))
    }

    async fn recorded(&self, job: &SummaryJob, result: Option<&Value>, error: Option<&str>) {
        let detail = json!({
            "job_id": job.id, "kind": job.kind, "user_id": job.user_id,
            "character_id": job.character_id, "summary_session": job.session_id,
            "result": result, "error": error,
        });
        let kind = match error {
            None => "summary_job_done",
            Some(_) => "summary_job_failed",
        };
        event(&self.svc.pool, kind, detail).await;
    }
}

/// What `close_if_idle.sql` says of a session.
#[derive(Debug, sqlx::FromRow)]
struct CloseCheck {
    closed: bool,
    already_closed: bool,
    due_at: DateTime<Utc>,
}

/// Closes the session when it has been idle 30 minutes at `now`; else waits for that.
async fn close(svc: &SummaryService, job: &SummaryJob, now: DateTime<Utc>) -> Result<Step> {
    let sid = job
        .session_id
        .ok_or_else(|| SummaryError::Invalid("close without session".into()))?;
    let check =
        sqlx::query_as::<_, CloseCheck>(include_str!("../../sql/summary/close_if_idle.sql"))
            .bind(sid)
            .bind(now)
            .fetch_one(&svc.pool)
            .await?;
    if check.closed || check.already_closed {
        return Ok(Step::Done(json!({"closed": check.closed})));
    }
    Ok(Step::Defer(check.due_at))
}

/// A dialogue line as the summary prompts show it.
fn line(role: &str, content: &str) -> String {
    let who = if role == "user" { "User" } else { "Character" };
    format!(
        "{who}: {}",
        content.split_whitespace().collect::<Vec<_>>().join(" ")
    )
}

async fn span(
    svc: &SummaryService,
    user: &str,
    character: i64,
    after: i64,
    upto: i64,
    limit: i64,
) -> Result<(Vec<String>, i64)> {
    let rows = sqlx::query_as::<_, MessageRow>(include_str!("../../sql/summary/span_messages.sql"))
        .bind(user)
        .bind(character)
        .bind(after)
        .bind(upto)
        .bind(limit)
        .fetch_all(&svc.pool)
        .await?;
    let last = rows.last().map_or(after, |r| r.id);
    let lines = rows.iter().map(|r| line(&r.role, &r.content)).collect();
    Ok((lines, last))
}

const ROLLING_SYSTEM: &str = "You keep a running summary of a conversation between a user and \
a character. Update the previous summary with the new messages. Keep what still matters from \
the previous summary, add what is new, drop small talk. Write at most 4 short plain sentences \
in the third person. Answer with the summary only.";

/// A user and character's `session_state`, as `state_get.sql` returns it.
#[derive(Debug, sqlx::FromRow)]
struct StateRow {
    message_count: i32,
    rolling_summary: String,
    rolling_last_message_id: i64,
}

/// Seed 001's rolling summary: previous summary + the messages since it → a new version of
/// at most 600 characters. Every version is kept; diagnostics go on `session_state`.
async fn rolling(svc: &SummaryService, job: &SummaryJob, now: DateTime<Utc>) -> Result<Value> {
    let character = job
        .character_id
        .ok_or_else(|| SummaryError::Invalid("rolling without character".into()))?;
    let st = sqlx::query_as::<_, StateRow>(include_str!("../../sql/summary/state_get.sql"))
        .bind(&job.user_id)
        .bind(character)
        .fetch_one(&svc.pool)
        .await?;
    let previous = st.rolling_summary;
    let message_count = st.message_count;
    let rebuild = job.is_rebuild();
    let after: i64 = if rebuild {
        0
    } else {
        st.rolling_last_message_id
    };
    sqlx::query(include_str!("../../sql/summary/rolling_attempt.sql"))
        .bind(&job.user_id)
        .bind(character)
        .bind(now)
        .execute(&svc.pool)
        .await?;
    let (lines, last) = span(svc, &job.user_id, character, after, i64::MAX, ROLLING_LINES).await?;
    let made = make_rolling(svc, &previous, lines).await;
    let (content, elapsed_ms, dropped) = match made {
        Ok(v) => v,
        Err((reason, detail)) => {
            let err = json!({"reason": reason, "detail": detail});
            sqlx::query(include_str!("../../sql/summary/rolling_failed.sql"))
                .bind(&job.user_id)
                .bind(character)
                .bind(&err)
                .execute(&svc.pool)
                .await?;
            return Err(SummaryError::Model(format!("{reason}: {detail}")));
        }
    };
    // One transaction: the history row and the current summary change together.
    let mut tx = svc.pool.begin().await?;
    let id: i64 = sqlx::query_scalar(include_str!("../../sql/summary/rolling_insert.sql"))
        .bind(&job.user_id)
        .bind(character)
        .bind(job.session_id)
        .bind(message_count)
        .bind(last)
        .bind(&content)
        .bind(elapsed_ms as i32)
        .fetch_one(&mut *tx)
        .await?;
    sqlx::query(include_str!("../../sql/summary/rolling_state.sql"))
        .bind(&job.user_id)
        .bind(character)
        .bind(&content)
        .bind(last)
        .bind(now)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(json!({
        "rolling_id": id, "chars": content.chars().count(), "message_count": message_count,
        "elapsed_ms": elapsed_ms, "lines_dropped": dropped,
    }))
}

/// The model call of a rolling summary; errors are (reason, detail) for the diagnostics.
pub async fn make_rolling(
    svc: &SummaryService,
    previous: &str,
    lines: Vec<String>,
) -> std::result::Result<(String, u64, usize), (&'static str, String)> {
    if lines.is_empty() {
        return Err((
            "no_messages",
            "nothing new since the last rolling summary".into(),
        ));
    }
    let model = svc
        .model()
        .map_err(|e| ("model_unavailable", e.to_string()))?;
    let prompt = Prompt {
        system: ROLLING_SYSTEM.into(),
        header: format!(
            "Previous summary: {}\nNew messages:",
            if previous.is_empty() {
                "(none)"
            } else {
                previous
            }
        ),
        lines,
        footer: "Updated summary:".into(),
        grammar: None,
        max_tokens: svc.config.rolling_max_tokens,
    };
    let g = model
        .generate(prompt)
        .await
        .map_err(|e| ("model_error", e.0))?;
    let content = clip(&g.text, ROLLING_MAX_CHARS);
    if content.is_empty() {
        return Err(("empty", "the model answered nothing".into()));
    }
    Ok((content, g.elapsed_ms, g.lines_dropped))
}

const SESSION_SYSTEM: &str = "You summarise a finished conversation between a user and a \
character as JSON. Write about the user in the third person, with the names and details the \
conversation gives: what happened, what mattered to the user, what is still unresolved, what \
anyone promised, who was mentioned, and the mood. Never copy these instructions.";

/// The part of a summary session (`session_get.sql`) its summary reads.
#[derive(Debug, sqlx::FromRow)]
struct SessionRow {
    user_id: String,
    character_id: i64,
    first_message_id: i64,
    last_message_id: i64,
}

/// Seed 001's session summary: grammar-constrained JSON, validated, retried with the
/// reason, then stored as an error with the raw answers when it never validates.
async fn session_summary(svc: &SummaryService, job: &SummaryJob) -> Result<Value> {
    let sid = job
        .session_id
        .ok_or_else(|| SummaryError::Invalid("session job without session".into()))?;
    let s = sqlx::query_as::<_, SessionRow>(include_str!("../../sql/summary/session_get.sql"))
        .bind(sid)
        .fetch_one(&svc.pool)
        .await?;
    let (user, character) = (s.user_id, s.character_id);
    let (lines, _) = span(
        svc,
        &user,
        character,
        s.first_message_id - 1,
        s.last_message_id,
        SESSION_LINES,
    )
    .await?;
    let made = summarise_session(svc, lines).await;
    let store = |status: &str, summary: Option<Value>, error: Option<String>, attempts, raw, ms| {
        sqlx::query_scalar::<_, i64>(include_str!("../../sql/summary/session_summary_insert.sql"))
            .bind(sid)
            .bind(user.clone())
            .bind(character)
            .bind(status.to_string())
            .bind(summary)
            .bind(error)
            .bind(attempts as i32)
            .bind(Value::from(raw))
            .bind(ms as i32)
    };
    match made {
        SessionOutcome::Valid {
            summary,
            attempts,
            raw,
            elapsed_ms,
        } => {
            let v = serde_json::to_value(&summary)?;
            let id = store("ok", Some(v), None, attempts, raw, elapsed_ms)
                .fetch_one(&svc.pool)
                .await?;
            Ok(json!({"session_summary_id": id, "attempts": attempts, "elapsed_ms": elapsed_ms}))
        }
        SessionOutcome::Invalid {
            error,
            attempts,
            raw,
            elapsed_ms,
        } => {
            let id = store(
                "error",
                None,
                Some(error.clone()),
                attempts,
                raw,
                elapsed_ms,
            )
            .fetch_one(&svc.pool)
            .await?;
            Err(SummaryError::Invalid(format!(
                "session summary {id} stored as an error after {attempts} attempts: {error}"
            )))
        }
    }
}

/// How a session summary came out.
#[derive(Debug, Clone, PartialEq)]
pub enum SessionOutcome {
    Valid {
        summary: SessionSummary,
        attempts: u32,
        raw: Vec<String>,
        elapsed_ms: u64,
    },
    Invalid {
        error: String,
        attempts: u32,
        raw: Vec<String>,
        elapsed_ms: u64,
    },
}

/// Asks for the JSON up to `max_attempts` times; each retry names the previous answer's
/// fault. A model error counts as an attempt.
pub async fn summarise_session(svc: &SummaryService, lines: Vec<String>) -> SessionOutcome {
    let (mut raw, mut elapsed_ms, mut error) = (Vec::new(), 0, String::new());
    let attempts = svc.config.max_attempts;
    let conversation = lines.join("\n");
    for attempt in 1..=attempts {
        let footer = match attempt {
            1 => "JSON summary:".to_string(),
            _ => format!("Your previous answer was refused ({error}). Write the JSON summary again, complete and shorter:"),
        };
        let prompt = Prompt {
            system: SESSION_SYSTEM.into(),
            header: "Conversation:".into(),
            lines: lines.clone(),
            footer,
            grammar: Some(schema::SESSION_GRAMMAR.into()),
            max_tokens: svc.config.session_max_tokens,
        };
        let g = match svc.model() {
            Ok(m) => m.generate(prompt).await.map_err(|e| e.0),
            Err(e) => Err(e.to_string()),
        };
        match g {
            Err(e) => error = format!("model error: {e}"),
            Ok(g) => {
                elapsed_ms += g.elapsed_ms;
                raw.push(g.text.clone());
                match schema::validate_against(&g.text, g.truncated, &conversation, SESSION_SYSTEM)
                {
                    Ok(summary) => {
                        return SessionOutcome::Valid {
                            summary,
                            attempts: attempt,
                            raw,
                            elapsed_ms,
                        }
                    }
                    Err(e) => error = e.to_string(),
                }
            }
        }
    }
    SessionOutcome::Invalid {
        error,
        attempts,
        raw,
        elapsed_ms,
    }
}

/// What `spine_inputs.sql` returns: the user's total, the latest spine (NULLs before the
/// first) and the summaries made since.
#[derive(Debug, sqlx::FromRow)]
struct SpineInputsRow {
    total: i32,
    content: Option<String>,
    message_total_at: Option<i32>,
    sessions: Value,
    rolling: Value,
}

/// Seed 001's spine: a new version per 20 user messages, from the previous version, the
/// session summaries since it and the current rolling summaries.
async fn spine_version(svc: &SummaryService, job: &SummaryJob) -> Result<Value> {
    let every: i32 = sqlx::query_scalar(include_str!("../../sql/summary/config_int.sql"))
        .bind("summary_spine_every")
        .bind(20)
        .fetch_one(&svc.pool)
        .await?;
    let r = sqlx::query_as::<_, SpineInputsRow>(include_str!("../../sql/summary/spine_inputs.sql"))
        .bind(&job.user_id)
        .fetch_one(&svc.pool)
        .await?;
    let total = r.total;
    let at = r.message_total_at.unwrap_or(0);
    let rebuild = job.is_rebuild();
    if total - at < every && !rebuild {
        return Ok(json!({"skipped": "fewer new messages than summary_spine_every"}));
    }
    let inputs = spine::Inputs {
        previous: r.content.unwrap_or_default(),
        sessions: r.sessions,
        rolling: r.rolling,
    };
    let made = spine::make(svc, &inputs).await?;
    let version: i32 = sqlx::query_scalar(include_str!("../../sql/summary/spine_insert.sql"))
        .bind(&job.user_id)
        .bind(&made.content)
        .bind(serde_json::to_value(&made.sections)?)
        .bind(total - at)
        .bind(total)
        .bind(made.elapsed_ms as i32)
        .fetch_one(&svc.pool)
        .await?;
    Ok(json!({"version": version, "message_count": total - at, "elapsed_ms": made.elapsed_ms}))
}

/// Seed 003's compaction of the chat session named in the payload, as of `now`.
async fn compact(svc: &SummaryService, job: &SummaryJob, now: DateTime<Utc>) -> Result<Value> {
    let session = job.payload["chat_session"]
        .as_str()
        .ok_or_else(|| SummaryError::Invalid("compact without chat_session".into()))?;
    let report = super::compaction::compact_session(svc, session, now.timestamp()).await?;
    Ok(serde_json::to_value(report)?)
}

/// Seed 004's merged user context, made on the lane when a session closes so that the
/// stored levels (`daily_summaries`, `historical_summaries`, `user_contexts`) are ready
/// before the user's next session. A model failure degrades (recorded), it does not fail.
async fn user_context(svc: &SummaryService, job: &SummaryJob, now: DateTime<Utc>) -> Result<Value> {
    let scope = job.payload["scope"].as_str().unwrap_or_default();
    let c = super::daily::user_context(svc, scope, &job.user_id, now).await?;
    Ok(json!({
        "scope": scope,
        "context_chars": c.context.chars().count(),
        "sources": c.sources,
        "degraded": c.degraded,
    }))
}

/// Runs due jobs until none is left (tests, `kvmem summary rebuild`).
pub async fn drain_at(svc: &SummaryService, now: DateTime<Utc>) -> Result<Vec<Outcome>> {
    lane::drain(&SummaryLane { svc, now }).await
}
