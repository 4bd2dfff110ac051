//! `kvmem demo --scene memory`: issue 14's summaries seen end to end on SmolLM2, through
//! the real queue, worker and summary lane. A first session of four turns gets a rolling
//! summary, goes idle, closes and is summarised; the next message opens a second session
//! whose context carries that summary.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde_json::Value;
use sqlx::PgPool;

use super::scene::{wait_done, DemoError, Result};
use crate::queue;
use crate::summary::demo;

/// The first session: four user turns, so seed 001's rolling summary is due.
const FIRST: [&str; 4] = [
    "Hi, I'm Sam. I just moved to Porto with my sister Ana.",
    "The move was stressful. I still need to find a flat near the river.",
    "I promised Ana I would visit three flats on Saturday.",
    "I also start my new nursing job next week, so I'm nervous.",
];
const SECOND: &str = "I'm back. Do you remember what I have to do on Saturday?";

/// The scene's idle timeout: production closes a session after 1800 s; the scene waits
/// this long instead so it runs in about a minute, or three times the first turn's
/// latency on a slow machine (a turn slower than the timeout would close the session
/// between two messages). The previous value is restored.
const DEMO_IDLE_S: u64 = 15;
const USER: &str = "demo_sam";

/// Plays the scene and returns the report to print.
pub async fn scene(pool: &PgPool) -> Result<String> {
    let before = demo::idle_timeout(pool).await?;
    set_idle(pool, &DEMO_IDLE_S.to_string()).await?;
    let played = play(pool).await;
    set_idle(pool, before.as_deref().unwrap_or("1800")).await?;
    played
}

async fn set_idle(pool: &PgPool, seconds: &str) -> Result<()> {
    Ok(demo::set_idle_timeout(pool, seconds).await?)
}

async fn play(pool: &PgPool) -> Result<String> {
    let ch = super::scene::demo_character(pool, USER).await?;
    let sid = format!("demo_mem_{}", chrono::Utc::now().format("%Y%m%d%H%M%S"));
    let mut turns = String::new();
    let first_ms = say(pool, &sid, ch, FIRST[0], &mut turns).await?;
    let idle = DEMO_IDLE_S.max(3 * first_ms.div_ceil(1000));
    set_idle(pool, &idle.to_string()).await?;
    let mut out =
        format!("## Session 1 (idle timeout {idle} s for the demo; 1800 s in production)\n");
    out.push_str(&turns);
    for msg in &FIRST[1..] {
        say(pool, &sid, ch, msg, &mut out).await?;
    }
    let first = wait_for_close(pool, ch).await?;
    report_first(pool, ch, first, &mut out).await?;
    let _ = writeln!(out, "\n## Session 2");
    say(pool, &sid, ch, SECOND, &mut out).await?;
    report_second(pool, ch, &mut out).await?;
    report_events(pool, &mut out).await?;
    Ok(out)
}

/// One turn through the queue; returns its wall time in milliseconds.
async fn say(pool: &PgPool, sid: &str, ch: i64, msg: &str, out: &mut String) -> Result<u64> {
    let started = Instant::now();
    let id = queue::enqueue(pool, sid, USER, ch, msg, None).await?;
    let reply = wait_done(pool, id).await?;
    eprintln!("user: {msg}\nreply: {}", reply.trim());
    let _ = writeln!(out, "user:  {msg}\nreply: {}", reply.trim());
    Ok(started.elapsed().as_millis() as u64)
}

/// Waits (real time: the close is a real-time behaviour) until the first session has
/// closed, its summary is stored and the rolling summary its fourth turn queued is made;
/// returns the session id.
async fn wait_for_close(pool: &PgPool, ch: i64) -> Result<i64> {
    eprintln!("demo: waiting for the session to go idle and be summarised");
    let deadline = Instant::now() + Duration::from_secs(1800);
    loop {
        let rows = demo::sessions(pool, USER, ch).await?;
        let closed = rows.first().filter(|r| r.ended_at.is_some()).map(|r| r.id);
        if let Some(id) = closed {
            if summarised(pool, ch, id).await? {
                return Ok(id);
            }
        }
        if Instant::now() > deadline {
            return Err(DemoError::Timeout(
                "the first session was not closed and summarised within 30 minutes",
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn summarised(pool: &PgPool, ch: i64, session: i64) -> Result<bool> {
    let session_done = demo::session_summarised(pool, session).await?;
    let rolling_done = demo::rolling_finished(pool, USER, ch).await?;
    Ok(session_done && rolling_done)
}

async fn report_first(pool: &PgPool, ch: i64, session: i64, out: &mut String) -> Result<()> {
    let rolling = demo::newest_rolling(pool, USER, ch).await?;
    if let Some((content, message_count, elapsed_ms)) = rolling {
        let _ = writeln!(
            out,
            "\nrolling summary after {message_count} messages ({elapsed_ms} ms on the model):\n  {content}"
        );
    }
    let s = demo::session_summary(pool, session).await?;
    let _ = writeln!(
        out,
        "\nsession {session} closed; session summary: status={} attempts={} ({} ms on the model)",
        s.status, s.attempts, s.elapsed_ms
    );
    let body = match s.summary {
        Some(v) => serde_json::to_string_pretty(&v)?,
        None => s.error.unwrap_or_default(),
    };
    let _ = writeln!(out, "{body}");
    Ok(())
}

/// The second session's context, as a backend reads it (`GET /v1/memory/summary`).
async fn report_second(pool: &PgPool, ch: i64, out: &mut String) -> Result<()> {
    let c = crate::summary::session_context::load(pool, USER, ch).await?;
    let _ = writeln!(
        out,
        "\nsession {} is open; its context (GET /v1/memory/summary?user={USER}&character={ch}):",
        c.open_session_id.unwrap_or_default()
    );
    let _ = writeln!(out, "{}", serde_json::to_string_pretty(&c)?);
    Ok(())
}

async fn report_events(pool: &PgPool, out: &mut String) -> Result<()> {
    let rows = demo::summary_events(pool, USER).await?;
    let _ = writeln!(out, "\nsummary events (as `kvmem status` reads them):");
    for (created_at, kind, detail) in &rows {
        let _ = writeln!(
            out,
            "  {} {:<24} {}",
            created_at.format("%H:%M:%S"),
            kind,
            short(detail)
        );
    }
    Ok(())
}

/// The parts of an event worth a line: kind of job, outcome, timing.
fn short(detail: &Value) -> String {
    let mut parts = Vec::new();
    for key in ["kind", "summary_session", "closed_by", "error"] {
        if let Some(v) = detail.get(key).filter(|v| !v.is_null()) {
            parts.push(format!("{key}={v}"));
        }
    }
    if let Some(ms) = detail.pointer("/result/elapsed_ms") {
        parts.push(format!("elapsed_ms={ms}"));
    }
    parts.join(" ")
}
