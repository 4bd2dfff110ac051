//! The lane under load: warming up, waiting for turns, sampling the backlog, and the
//! invariants checked after a run.

use super::*;

/// The memory lane's jobs at the end of a phase, read from its tables.
pub(super) struct LaneFigures {
    pub(super) enqueued: i64,
    pub(super) done: i64,
    pub(super) queued: i64,
    pub(super) failed: i64,
    pub(super) dropped_rows: i64,
    pub(super) dropped: i64,
    pub(super) extracted_in_chat: i64,
    pub(super) extracted: i64,
    pub(super) skipped: i64,
    pub(super) model_runs: i64,
    pub(super) facts: i64,
    pub(super) errors: i64,
    pub(super) model_s: Vec<f64>,
}

pub(super) async fn lane_figures(pool: &PgPool, chat_end: DateTime<Utc>) -> Result<LaneFigures> {
    let (enqueued, done, queued, failed, dropped_rows, dropped): (i64, i64, i64, i64, i64, i64) =
        sqlx::query_as(
            "SELECT count(*), count(*) FILTER (WHERE state = 'done'),
                    count(*) FILTER (WHERE state IN ('queued', 'running')),
                    count(*) FILTER (WHERE state = 'failed'),
                    count(*) FILTER (WHERE state = 'dropped'),
                    (SELECT coalesce(sum(dropped), 0)::bigint FROM memory_job_drops WHERE user_id <> $1)
               FROM memory_jobs WHERE user_id <> $1",
        )
        .bind(WARMUP)
        .fetch_one(pool)
        .await?;
    // Extracted: a user message's ingest job that went through extraction, by the model
    // or by its skip rule (small talk, questions); the assistant's lines are only embedded.
    let (extracted_in_chat, extracted, skipped, model_runs, facts, errors): (
        i64,
        i64,
        i64,
        i64,
        i64,
        i64,
    ) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE extracted AND j.finished_at <= $2),
                count(*) FILTER (WHERE extracted),
                count(*) FILTER (WHERE extracted AND j.result ? 'extract_skipped'),
                count(*) FILTER (WHERE extracted AND NOT j.result ? 'extract_skipped'),
                coalesce(sum((j.result ->> 'facts')::int), 0)::bigint,
                count(*) FILTER (WHERE j.result ? 'extract_error')
           FROM memory_jobs j
           JOIN memory_messages m ON m.id = j.memory_message_id
           CROSS JOIN LATERAL (SELECT coalesce((j.result ->> 'extracted')::boolean, false) AS extracted) e
          WHERE j.user_id <> $1 AND j.kind = 'ingest' AND j.state = 'done' AND m.speaker = 'user'",
    )
    .bind(WARMUP)
    .bind(chat_end)
    .fetch_one(pool)
    .await?;
    let model_s: Vec<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM j.finished_at - j.started_at)::float8
           FROM memory_jobs j JOIN memory_messages m ON m.id = j.memory_message_id
          WHERE j.user_id <> $1 AND j.state = 'done' AND m.speaker = 'user'
            AND (j.result ->> 'extracted')::boolean AND NOT j.result ? 'extract_skipped'",
    )
    .bind(WARMUP)
    .fetch_all(pool)
    .await?;
    Ok(LaneFigures {
        enqueued,
        done,
        queued,
        failed,
        dropped_rows,
        dropped,
        extracted_in_chat,
        extracted,
        skipped,
        model_runs,
        facts,
        errors,
        model_s,
    })
}

pub(super) fn memory_json(m: LaneFigures, chat_window_s: f64, lane: bool) -> Value {
    json!({
        "enqueued": m.enqueued, "done": m.done, "queued_at_end": m.queued, "failed": m.failed,
        "dropped": m.dropped, "dropped_rows": m.dropped_rows,
        "extracted": m.extracted, "extracted_during_chat": m.extracted_in_chat,
        "extract_skipped": m.skipped, "extract_model_runs": m.model_runs,
        "extract_errors": m.errors, "facts_stored": m.facts,
        "extract_per_s": m.extracted_in_chat as f64 / chat_window_s.max(1e-3),
        "model_run_s": common::pcts(m.model_s),
        "kept_up": lane.then_some(m.queued == 0),
    })
}

/// One turn on a user of its own, so the chat clock starts with the model loaded and, with
/// the lane on, the lane running: its short message is skipped by the extractor's rule, and
/// the lane takes jobs only after loading the extraction model.
pub(super) async fn warm_up(pool: &PgPool, worker: &mut Worker, ch: i64, lane: bool) -> Result<()> {
    sqlx::query("SELECT kvmem_enqueue_turn($1, $1, $2, 'Hi there!')")
        .bind(WARMUP)
        .bind(ch)
        .execute(pool)
        .await?;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let (turn_done, jobs_left): (bool, i64) = sqlx::query_as(
            "SELECT EXISTS (SELECT 1 FROM turns WHERE user_id = $1 AND state = 'done'),
                    (SELECT count(*) FROM memory_jobs WHERE user_id = $1 AND state IN ('queued', 'running'))",
        )
        .bind(WARMUP)
        .fetch_one(pool)
        .await?;
        if turn_done && (!lane || jobs_left == 0) {
            return Ok(());
        }
        worker.check_alive()?;
        ensure!(
            Instant::now() < deadline,
            "the warm-up turn took over 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub(super) async fn wait_turns(pool: &PgPool, worker: &mut Worker, total: i64) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(3600);
    loop {
        let (done, failed): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE state = 'done'), count(*) FILTER (WHERE state IN ('failed', 'dead'))
               FROM turns WHERE user_id <> $1",
        )
        .bind(WARMUP)
        .fetch_one(pool)
        .await?;
        ensure!(failed == 0, "{failed} turns failed");
        if done >= total {
            return Ok(());
        }
        worker.check_alive()?;
        ensure!(
            Instant::now() < deadline,
            "turns not done an hour after the last was enqueued: {done} of {total}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Gives the lane up to [`DRAIN`] to finish its queue; returns the seconds it took.
pub(super) async fn drain(pool: &PgPool, worker: &mut Worker) -> Result<f64> {
    let start = Instant::now();
    loop {
        let left: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM memory_jobs WHERE user_id <> $1 AND state IN ('queued', 'running')",
        )
        .bind(WARMUP)
        .fetch_one(pool)
        .await?;
        if left == 0 || start.elapsed() >= DRAIN {
            return Ok(start.elapsed().as_secs_f64());
        }
        worker.check_alive()?;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The backlogs seen over a phase: peaks, and a sample every 30 s for the plot.
pub(super) struct Backlog {
    pub(super) max_turns: i64,
    pub(super) max_jobs: i64,
    /// `[seconds in, turns waiting, memory jobs queued]`.
    pub(super) series: Vec<[i64; 3]>,
}

/// Samples, once a second until `stop`, the turns waiting for the worker and the memory
/// jobs queued: the peaks say whether chat or the lane fell behind during the phase, the
/// series whether the lane's backlog grew without bound.
pub(super) fn sample_backlogs(pool: PgPool) -> (Arc<AtomicBool>, tokio::task::JoinHandle<Backlog>) {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let task = tokio::spawn(async move {
        let start = Instant::now();
        let mut b = Backlog {
            max_turns: 0,
            max_jobs: 0,
            series: Vec::new(),
        };
        let mut next_point = 0;
        while !flag.load(Ordering::Relaxed) {
            let row: Result<(i64, i64), _> = sqlx::query_as(
                "SELECT (SELECT count(*) FROM turns WHERE user_id <> $1 AND state = 'queued'),
                        (SELECT count(*) FROM memory_jobs WHERE user_id <> $1 AND state = 'queued')",
            )
            .bind(WARMUP)
            .fetch_one(&pool)
            .await;
            if let Ok((t, m)) = row {
                b.max_turns = b.max_turns.max(t);
                b.max_jobs = b.max_jobs.max(m);
                let at = start.elapsed().as_secs() as i64;
                if at >= next_point {
                    b.series.push([at, t, m]);
                    next_point = at + 30;
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        b
    });
    (stop, task)
}

/// What load must never break: every enqueued turn done exactly once with one reply, in
/// session order, never two turns of a session at once.
pub(super) async fn check_invariants(pool: &PgPool, ids: &[i64]) -> Result<()> {
    let total = ids.len() as i64;
    let mut distinct = ids.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    ensure!(
        distinct.len() == ids.len(),
        "{} enqueues returned {} distinct turn ids",
        ids.len(),
        distinct.len()
    );
    let (rows, done, ok_runs, ok_turns, replies, violations): (i64, i64, i64, i64, i64, i64) =
        sqlx::query_as(
            "WITH t AS (SELECT * FROM turns WHERE id = ANY($1)),
                  l AS (SELECT l.sid, l.turn_id, l.started_at, l.finished_at,
                               lag(l.turn_id) OVER w AS prev_id, lag(l.finished_at) OVER w AS prev_end
                          FROM turn_log l JOIN t ON t.id = l.turn_id
                         WHERE l.status = 'OK' WINDOW w AS (PARTITION BY l.sid ORDER BY l.started_at))
             SELECT (SELECT count(*) FROM t),
                    (SELECT count(*) FROM t WHERE state = 'done' AND reply IS NOT NULL),
                    (SELECT count(*) FROM l),
                    (SELECT count(DISTINCT turn_id) FROM l),
                    (SELECT count(*) FROM messages m JOIN t ON t.id = m.turn_id WHERE m.role = 'assistant'),
                    (SELECT count(*) FROM l WHERE prev_id > turn_id OR prev_end > started_at)",
        )
        .bind(ids)
        .fetch_one(pool)
        .await?;
    let stray: i64 =
        sqlx::query_scalar("SELECT count(*) FROM turns WHERE user_id <> $1 AND NOT id = ANY($2)")
            .bind(WARMUP)
            .bind(ids)
            .fetch_one(pool)
            .await?;
    ensure!(
        rows == total && stray == 0,
        "{rows} of {total} enqueued turns found, {stray} others"
    );
    ensure!(done == total, "{done} of {total} turns done with a reply");
    ensure!(
        ok_runs == total && ok_turns == total,
        "{ok_runs} successful runs over {ok_turns} turns for {total} turns"
    );
    ensure!(replies == total, "{replies} replies for {total} turns");
    ensure!(violations == 0, "{violations} order or overlap violations");
    Ok(())
}
