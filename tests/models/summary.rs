//! Summaries (issue 14) on real Postgres and real models: the 30-minute close on a clock the
//! test moves, the 4-turn and 20-message triggers, session-summary validation and retries,
//! seed 004's cache keys, invalidation and day rollover, degradation with a failing model,
//! seed 003's compaction (51 entries, > 100k tokens), task pruning and JSON round-trip. The
//! tiny random model drives mechanics; SmolLM2 is used where the text matters.

use crate::common;

use std::sync::{Arc, OnceLock};

use chrono::{DateTime, Duration, NaiveDate, TimeZone, Utc};
use kvmem::engine::Engine;
use kvmem::summary::cache::Source;
use kvmem::summary::context_manager::{
    bullet_summary, ContextCompactor, ContextData, ContextManager, HistoryEntry, Task, TaskStatus,
};
use kvmem::summary::jobs::{self, Outcome};
use kvmem::summary::{daily, schema, SummaryConfig, SummaryService};
use serde_json::{json, Value};
use sqlx::{PgPool, Row};

fn tiny_engine() -> Arc<Engine> {
    static E: OnceLock<Arc<Engine>> = OnceLock::new();
    E.get_or_init(|| {
        common::load_engine(
            &common::tiny_model(),
            &common::settings(json!({"n_ctx": 4096})),
        )
    })
    .clone()
}

fn smol_engine() -> Arc<Engine> {
    static E: OnceLock<Arc<Engine>> = OnceLock::new();
    E.get_or_init(|| {
        common::load_engine(
            &common::smollm2(),
            &common::settings(json!({"n_ctx": 4096})),
        )
    })
    .clone()
}

fn config() -> SummaryConfig {
    SummaryConfig::from_settings(&common::settings(json!({})))
}

async fn service(pool: &PgPool, engine: Arc<Engine>, config: SummaryConfig) -> SummaryService {
    common::migrate(pool).await;
    kvmem::system::summary_service_on(pool.clone(), config, Some(engine), None)
        .expect("summary service")
}

fn at(h: u32, m: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 3, 10, h, m, 0).unwrap()
}

/// A done turn with its two messages at `when`, as the completion writes them.
async fn turn(
    pool: &PgPool,
    user: &str,
    character: i64,
    when: DateTime<Utc>,
    text: &str,
    reply: &str,
) -> i64 {
    let turn: i64 = sqlx::query_scalar(
        "INSERT INTO turns (session_id, user_id, character_id, message, state, reply)
         VALUES ($1, $2, $3, $4, 'done', $5) RETURNING id",
    )
    .bind(format!("chat-{user}-{character}"))
    .bind(user)
    .bind(character)
    .bind(text)
    .bind(reply)
    .fetch_one(pool)
    .await
    .unwrap();
    for (role, content) in [("user", text), ("assistant", reply)] {
        sqlx::query("INSERT INTO messages (session_id, turn_id, role, content, created_at) VALUES ($1, $2, $3, $4, $5)")
            .bind(format!("chat-{user}-{character}"))
            .bind(turn)
            .bind(role)
            .bind(content)
            .bind(when)
            .execute(pool)
            .await
            .unwrap();
    }
    turn
}

async fn queued(pool: &PgPool, kind: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM summary_jobs WHERE kind = $1 AND state = 'queued'")
        .bind(kind)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn sessions(pool: &PgPool) -> Vec<(i64, Option<DateTime<Utc>>, i32)> {
    sqlx::query("SELECT id, ended_at, turn_count FROM summary_sessions ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get("id"), r.get("ended_at"), r.get("turn_count")))
        .collect()
}

fn kind(o: &Outcome) -> (&str, bool) {
    match o {
        Outcome::Done { kind, .. } => (kind, true),
        Outcome::Failed { kind, .. } => (kind, false),
        Outcome::Empty => ("empty", true),
        Outcome::Busy => ("busy", true),
        Outcome::Erased { .. } => ("erased", false),
    }
}

mod days;
mod sessions;
/// Two users' messages in `guild` (None = direct chats) on 2026-03-10 (today) and on two
/// of days 2–7.
async fn seed_days(pool: &PgPool, guild: Option<&str>) {
    let rows = [
        (
            "u1",
            "2026-03-10T09:00:00Z",
            "I ran 10 km this morning, feeling great.",
        ),
        ("u2", "2026-03-10T09:05:00Z", "My cat is sick, I'm worried."),
        (
            "u1",
            "2026-03-05T19:00:00Z",
            "Work was stressful, went to the gym after.",
        ),
        (
            "u1",
            "2026-03-08T20:00:00Z",
            "Another long day, gym again to clear my head.",
        ),
        (
            "u2",
            "2026-03-08T08:00:00Z",
            "Baked bread for the neighbours.",
        ),
    ];
    for (i, (user, when, text)) in rows.iter().enumerate() {
        sqlx::query(
            "INSERT INTO memory_messages (user_id, guild_id, session_id, message_id, speaker, text, at)
             VALUES ($1, $5, 's', $2, $1, $3, $4::timestamptz)",
        )
        .bind(user)
        .bind(format!("m{i}"))
        .bind(text)
        .bind(when)
        .bind(guild)
        .execute(pool)
        .await
        .unwrap();
    }
}

fn roomy() -> SummaryConfig {
    let mut c = config();
    // The random tiny model writes long strings up to the grammar's bound.
    c.daily_max_tokens_per_user = 700;
    c
}

mod compaction;
mod walls;
