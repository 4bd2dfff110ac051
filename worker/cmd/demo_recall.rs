//! `kvmem demo --scene recall`: issue 15's proof that memory reaches the model through the
//! KV. In session 1 the user mentions a person, a place and a plan in passing; thirty
//! simulated minutes later the session closes and is summarised; session 2 is a new
//! session with a cold KV whose questions are answered from recall and the context block.
//! The table shows what each turn injected, read from its `turn_log` row and committed KV.

use std::fmt::Write as _;
use std::sync::Arc;

use chrono::{Duration, Utc};
use sqlx::PgPool;

use super::scene::{wait_done, Result};
use crate::config::Settings;
use crate::engine::Engine;
use crate::queue;

const USER: &str = "demo_rae";
/// Session 1: three facts, each in passing.
const FIRST: [&str; 3] = [
    "My sister Maya came over for dinner last night and cooked a huge curry.",
    "It reminded me of Lisbon, where I grew up, right next to the old tram line.",
    "Anyway, next month I'm planning to run the Porto half marathon with her.",
];
/// Session 2: one question per fact, and the word a reply holding the fact contains.
const SECOND: [(&str, &str); 3] = [
    ("What is my sister's name again?", "Maya"),
    ("Which city did I grow up in?", "Lisbon"),
    ("What race am I planning to run next month?", "Porto"),
];

/// Plays the scene and returns the report to print. The worker runs the turns; the scene
/// runs the memory and summary lanes itself, so the close can happen on a simulated clock.
pub async fn scene(pool: &PgPool, settings: &Settings, engine: Arc<Engine>) -> Result<String> {
    let ch = super::scene::demo_character(pool, USER).await?;
    let stamp = Utc::now().format("%Y%m%d%H%M%S");
    let (s1, s2) = (
        format!("demo_recall_{stamp}_1"),
        format!("demo_recall_{stamp}_2"),
    );
    let mut out = String::from("## Session 1\n");
    for msg in FIRST {
        say(pool, &s1, ch, msg, &mut out).await?;
    }
    let _ = writeln!(out, "\n## Thirty simulated minutes later");
    lanes(pool, settings, engine.clone(), &mut out).await?;
    let _ = writeln!(out, "\n## Session 2 (new session id, cold KV)");
    let mut turns = Vec::new();
    for (msg, _) in SECOND {
        let id = say(pool, &s2, ch, msg, &mut out).await?;
        turns.push((id, newest_recall(pool, &engine, &s2).await?));
    }
    table(pool, &turns, &mut out).await?;
    Ok(out)
}

/// One turn through the queue.
async fn say(pool: &PgPool, sid: &str, ch: i64, msg: &str, out: &mut String) -> Result<i64> {
    let id = queue::enqueue(pool, sid, USER, ch, msg, None).await?;
    let reply = wait_done(pool, id).await?;
    eprintln!("user: {msg}\nreply: {}", reply.trim());
    let _ = writeln!(out, "user:  {msg}\nreply: {}", reply.trim());
    Ok(id.0)
}

/// The memory lane (the dialogue's embeddings) and the summary lane at now + 31 minutes:
/// the idle session closes, is summarised, and the user's context is made.
async fn lanes(
    pool: &PgPool,
    settings: &Settings,
    engine: Arc<Engine>,
    out: &mut String,
) -> Result<()> {
    let memory =
        crate::system::memory_lane_service(pool.clone(), settings, Some(engine.clone()), None)
            .await
            .map_err(|e| super::scene::DemoError::Memory(e.to_string()))?;
    let embedded = crate::memory::ingest::jobs::drain(&memory)
        .await
        .map_err(|e| super::scene::DemoError::Memory(e.to_string()))?;
    let never_busy: crate::engine::Busy = Arc::new(|| false);
    let summary =
        crate::system::summary_lane_service(pool.clone(), settings, Some(engine), never_busy).await;
    let later = Utc::now() + Duration::minutes(31);
    eprintln!("demo: closing session 1 at {later} and summarising it");
    let jobs = crate::summary::jobs::drain_at(&summary, later).await?;
    let _ = writeln!(
        out,
        "memory lane: {} jobs (embeddings); summary lane at {}: {} jobs",
        embedded.len(),
        later.format("%H:%M:%S"),
        jobs.len()
    );
    let row = crate::summary::demo::newest_session_summary(pool, USER).await?;
    if let Some((status, summary)) = row {
        let _ = writeln!(
            out,
            "session summary ({status}): {}",
            summary.map(|v| v.to_string()).unwrap_or_default()
        );
    }
    Ok(())
}

/// Whether `text` names `fact`, in any case ("porto" counts for "Porto").
fn holds(text: &str, fact: &str) -> bool {
    text.to_lowercase().contains(&fact.to_lowercase())
}

/// The newest recall block in the session's committed KV, as the model saw it.
async fn newest_recall(pool: &PgPool, engine: &Engine, sid: &str) -> Result<String> {
    let (ids, table) = queue::session_kv_tokens(pool, sid).await?;
    let Ok(segments) = crate::snapshot::parse_segments(&table, ids.len() as u32) else {
        return Ok(String::new());
    };
    let mut at = 0;
    let mut newest = String::new();
    for seg in segments {
        let span = &ids[at..at + seg.len as usize];
        at += seg.len as usize;
        if seg.kind == crate::snapshot::SegKind::Recall {
            let tokens: Vec<_> = span
                .iter()
                .map(|&t| llama_cpp_2::token::LlamaToken(t))
                .collect();
            newest = engine.detokenize(&tokens);
        }
    }
    Ok(newest)
}

/// Per turn of session 2: what recall injected, whether the context went in, the KV size,
/// and whether the reply holds the fact asked about.
async fn table(pool: &PgPool, turns: &[(i64, String)], out: &mut String) -> Result<()> {
    let _ = writeln!(
        out,
        "\n| turn | recalled (injected ids) | M tokens | recall holds the fact | context injected (tokens) | tokens_in_kv | reply contains the fact |"
    );
    let _ = writeln!(out, "|---|---|---:|---|---|---:|---|");
    let mut blocks = String::new();
    for (i, ((id, recalled), (_, fact))) in turns.iter().zip(SECOND).enumerate() {
        let r = queue::turn_injected(pool, queue::TurnId(*id)).await?;
        let m_tokens = r.m_tokens;
        // The session's newest recall block is this turn's only if the turn injected one.
        let recalled = if m_tokens > 0 { recalled.as_str() } else { "" };
        let _ = writeln!(
            blocks,
            "S2.T{}: {}",
            i + 1,
            if recalled.is_empty() {
                "(nothing new)"
            } else {
                recalled.trim()
            }
        );
        let _ = writeln!(
            out,
            "| S2.T{} | {} | {m_tokens} | {} | {} ({}) | {} | {} ({fact}) |",
            i + 1,
            if r.memory_keys.is_empty() {
                "-".to_string()
            } else {
                r.memory_keys.join(" ")
            },
            if holds(recalled, fact) { "yes" } else { "no" },
            r.context_injected,
            r.c_tokens,
            r.tokens_in_kv,
            if holds(&r.reply, fact) { "yes" } else { "no" },
        );
    }
    let _ = writeln!(
        out,
        "\nWhat each turn's recall block put into the KV:\n{blocks}"
    );
    let _ = writeln!(
        out,
        "ids: m<memory id>, x<hash of a past message>, c<hash of an entity card>; the recalled text is in \
         the turn's recall segment of the committed KV (`session_kv`)."
    );
    Ok(())
}
