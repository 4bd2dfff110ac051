//! The memory lane: ingest (clean, embed, extract), remember and forget run as jobs in
//! Postgres, ordered per user and below live turns, so memory work never blocks a chat
//! turn and every outcome (including "nothing found") is recorded on the job row.

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::lane::{self, Claim, Job, Lane, Step};

use crate::memory::embed::{self, Role};
use crate::memory::error::{MemoryError, Result};
use crate::memory::events::event;
use crate::memory::extractor::ExtractedFact;
use crate::memory::ingest::backfill::fill_vectorless;
use crate::memory::job::job_text;
use crate::memory::notes::blob::rebuild_blob;
use crate::memory::notes::todos;
use crate::memory::notes::{about, lore};
use crate::memory::search::{content_words, message_key, overlap, spans};
use crate::memory::service::MemoryService;
use crate::memory::store::{self, FactType, Kind, NewMemory, Scope, Source};

/// A running memory job older than this is taken to be orphaned and is run again.
pub const STALE_JOB_SECS: f64 = 300.0;
/// Seed 002's cleaning limits.
pub const MAX_CLEAN_CHARS: usize = 320;
pub const MIN_CLEAN_CHARS: usize = 4;
/// Seed 002: at most 4 facts per message.
pub const MAX_FACTS_PER_MESSAGE: usize = 4;
/// Forget matches a fact when this share of the request's words is in it...
pub const FORGET_OVERLAP: f64 = 0.6;
/// ...or when the vectors are this close.
pub const FORGET_COSINE: f64 = 0.80;

/// A memory job's outcome: the one every lane reports.
pub use crate::lane::Outcome;

/// Seed 002's cleaning: trim, collapse whitespace, cut to 320 characters.
pub fn clean(text: &str) -> Option<String> {
    let c: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let c: String = c.chars().take(MAX_CLEAN_CHARS).collect();
    (c.chars().count() >= MIN_CLEAN_CHARS).then_some(c)
}

/// A claimed job, as `job_claim.sql` returns it.
#[derive(Debug, sqlx::FromRow)]
pub struct MemoryJob {
    id: i64,
    user_id: String,
    character_id: Option<i64>,
    guild_id: Option<String>,
    kind: String,
    /// The message an ingest is about; NULL once that message was deleted.
    memory_message_id: Option<i64>,
    payload: serde_json::Value,
}

impl Job for MemoryJob {
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

/// The memory lane on the shared job-lane mechanism: per-user order, and a job that asks
/// for extraction waits for a lane that has an extraction model.
impl Lane for MemoryService {
    type Job = MemoryJob;
    type Error = MemoryError;
    const NAME: &'static str = "memory";
    const STALE_SECS: f64 = STALE_JOB_SECS;
    const REAP_SQL: &'static str = include_str!("../../../sql/memory/job_reap.sql");
    const CLAIM_SQL: &'static str = include_str!("../../../sql/memory/job_claim.sql");
    const FINISH_SQL: &'static str = include_str!("../../../sql/memory/job_finish.sql");

    fn pool(&self) -> &PgPool {
        &self.pool
    }

    fn bind_claim<'q>(&self, claim: Claim<'q, MemoryJob>) -> Claim<'q, MemoryJob> {
        claim.bind(self.extractor.is_some())
    }

    /// Embedder and extractor failures are events and the job still completes (ingestion
    /// continues); any error fails the job, database errors included.
    async fn work(&self, job: &MemoryJob) -> Result<Step> {
        let scope = Scope {
            user_id: job.user_id.clone(),
            character_id: job.character_id,
            guild_id: job.guild_id.clone(),
            channel_id: None,
        };
        let payload = &job.payload;
        let res = match job.kind.as_str() {
            "ingest" => ingest(self, job.memory_message_id).await,
            "remember" => remember(self, &scope, payload).await,
            "forget" => forget(self, &scope, payload).await,
            "line" => lore::remember_line(self, &scope, payload).await,
            "remember_about" => about::remember_about(self, &scope, payload).await,
            other => Err(MemoryError::Invalid(format!("unknown job kind {other}"))),
        };
        res.map(Step::Done)
    }

    async fn recorded(&self, job: &MemoryJob, _result: Option<&Value>, error: Option<&str>) {
        if let Some(msg) = error {
            event(&self.pool, "memory_job_failed", msg, Some(&job.user_id)).await;
        }
    }
}

/// Claims and runs the next memory job. Embedder and extractor failures are events and
/// the job still completes (ingestion continues); only database errors fail the call.
pub async fn process_next_memory_job(svc: &MemoryService) -> Result<Outcome> {
    lane::run_next(svc).await
}

/// The message an ingest job is about, as `job_message.sql` returns it.
#[derive(Debug, sqlx::FromRow)]
struct JobMessage {
    user_id: String,
    character_id: Option<i64>,
    guild_id: Option<String>,
    channel_id: Option<String>,
    session_id: String,
    message_id: String,
    speaker: String,
    text: String,
    /// The previous message of the session, if any.
    context: Option<String>,
    at: DateTime<Utc>,
    unembedded: bool,
}

/// The message an ingest job is about, its vector state read from the embedder's columns.
async fn job_message(svc: &MemoryService, mid: i64) -> Result<Option<JobMessage>> {
    let sql = include_str!("../../../sql/memory/job_message.sql");
    Ok(sqlx::query_as::<_, JobMessage>(svc.columns().sql(sql))
        .bind(mid)
        .fetch_optional(&svc.pool)
        .await?)
}

async fn ingest(svc: &MemoryService, message: Option<i64>) -> Result<serde_json::Value> {
    let Some(mid) = message else {
        return Ok(json!({"skipped": "message deleted"}));
    };
    let Some(m) = job_message(svc, mid).await? else {
        return Ok(json!({"skipped": "message deleted"}));
    };
    let Some(cleaned) = clean(&m.text) else {
        return Ok(json!({"skipped": "too short"}));
    };
    let mut result = json!({"embedded": false, "facts": 0});
    if m.unembedded {
        embed_message(svc, mid, &m, &mut result).await?;
    }
    // The vectors a search used to fill on its request path (it only reads now).
    let back = fill_vectorless(svc, &m.user_id).await?;
    if back > 0 {
        result["backfilled"] = json!(back);
    }
    // Facts and todos come from what the user said, not from the character's replies.
    if m.speaker == "assistant" {
        return Ok(result);
    }
    // Todos are persona-scoped: a message said to no character makes none. A replay's
    // copy of a message (`replay:<run>:<source>`) is not said again: replaying a session
    // must not reopen the todos its later messages closed.
    let character = m
        .character_id
        .filter(|_| !crate::turn::is_replay(&m.session_id));
    if let Some(character) = character {
        let applied = todos::apply(
            &svc.pool,
            &m.user_id,
            character,
            &m.message_id,
            &m.text,
            m.at,
        )
        .await?;
        result["todos"] = json!(applied);
    }
    let Some(extractor) = svc.extractor.clone() else {
        return Ok(result);
    };
    // The skip rule is the extraction's first step: such a message is done without the
    // model, and the result says why.
    if let Some(why) = crate::memory::ingest::extract::skip_reason(&cleaned) {
        result["extracted"] = json!(true);
        result["extract_skipped"] = json!(why);
        return Ok(result);
    }
    // A turn files the user's words under the role "user"; facts name their subject, so
    // the user is "User" ("User teaches chemistry"), which the subject rule accepts only
    // as the speaker.
    let sp = match m.speaker.as_str() {
        "user" => "User".to_string(),
        s => s.to_string(),
    };
    let tx = cleaned.clone();
    let asked = tokio::task::spawn_blocking(move || extractor.extract(&sp, &tx)).await;
    let facts = match asked
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.0))
    {
        Ok(f) => f,
        Err(e) => {
            event(&svc.pool, "memory_extract_error", &e, Some(&m.user_id)).await;
            result["extract_error"] = json!(e);
            return Ok(result);
        }
    };
    result["extracted"] = json!(true);
    result["facts"] = json!(store_facts(svc, &m, facts).await?);
    Ok(result)
}

/// Span vectors one ingest job fills at most.
const SPANS_PER_JOB: usize = 32;

/// Embeds the message with the one before it and stores the vector; says in `result`
/// whether it did, or why not.
async fn embed_message(
    svc: &MemoryService,
    mid: i64,
    m: &JobMessage,
    result: &mut Value,
) -> Result<()> {
    let key = message_key(&m.speaker, &m.text, m.context.as_deref());
    if let Some(v) = svc.embed(vec![key], Role::Passage).await {
        sqlx::query(
            svc.columns()
                .sql(include_str!("../../../sql/memory/set_message_vectors.sql")),
        )
        .bind(vec![mid])
        .bind(vec![pgvector::Vector::from(v[0].clone())])
        .bind(svc.model_id())
        .execute(&svc.pool)
        .await?;
        result["embedded"] = json!(true);
        // Its span: the turns before it are in, as the lane keeps each user's order. A
        // few older messages without one go along (a history from before spans existed
        // fills a little per job; `kvmem memory reindex` fills it at once).
        // A failed span embedding is an event (the embedder recorded it) and leaves the
        // rows without a span vector for a later job or a reindex; the message's own
        // vector is stored and its extraction still runs.
        match spans::fill(svc, Some(&m.user_id), Some(SPANS_PER_JOB)).await {
            Ok(n) => result["spans"] = json!(n),
            Err(MemoryError::Embed(e)) => result["spans_error"] = json!(e.to_string()),
            Err(e) => return Err(e),
        }
    } else if svc.embedder.is_none() {
        result["embed_skipped"] = json!("no embedder");
    }
    Ok(())
}

/// Stores the first facts extracted from message `m`; a fact the store's screens reject is
/// an event, not an error. Returns how many were stored.
async fn store_facts(
    svc: &MemoryService,
    m: &JobMessage,
    facts: Vec<ExtractedFact>,
) -> Result<usize> {
    let (user, message_id) = (&m.user_id, &m.message_id);
    let mut stored = 0;
    for f in facts.into_iter().take(MAX_FACTS_PER_MESSAGE) {
        let mut nm = NewMemory::new(user, f.kind, f.fact_type, &f.text, Source::Extraction);
        nm.character_id = None;
        nm.guild_id = m.guild_id.clone();
        nm.channel_id = m.channel_id.clone();
        nm.entity_refs = f.entity_refs;
        nm.entity_label = f.entity_label;
        nm.importance = f.importance.unwrap_or(1).clamp(0, 3);
        nm.confidence = f.confidence.unwrap_or(0.7).clamp(0.0, 1.0);
        nm.evidence_text = f.evidence_text;
        nm.source_message_ids = vec![message_id.clone()];
        nm.valid_from = m.at;
        svc.embed_memory(&mut nm).await;
        match store::upsert(&svc.pool, nm).await {
            Ok(_) => stored += 1,
            Err(MemoryError::Invalid(reason)) => {
                event(&svc.pool, "memory_fact_rejected", &reason, Some(user)).await;
            }
            Err(e) => return Err(e),
        }
    }
    store::archive_keep(&svc.pool, user, svc.config.keep_user, svc.config.keep_lore).await?;
    Ok(stored)
}

async fn remember(
    svc: &MemoryService,
    scope: &Scope,
    payload: &serde_json::Value,
) -> Result<serde_json::Value> {
    let text = job_text(payload, "remember")?;
    let kind = payload["kind"]
        .as_str()
        .map(Kind::parse)
        .transpose()?
        .unwrap_or(Kind::Profile);
    let fact_type = payload["fact_type"]
        .as_str()
        .map(FactType::normalise)
        .unwrap_or(FactType::Other);
    let mut m = NewMemory::new(&scope.user_id, kind, fact_type, text, Source::Explicit);
    m.character_id = scope.character_id;
    m.guild_id = scope.guild_id.clone();
    m.pinned = true;
    m.confidence = 1.0;
    m.entity_refs = payload["entity_refs"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    // An in-chat remember cites the turn that asked, so an erase of its dialogue takes it.
    if let Some(source) = payload["source"].as_str() {
        m.source_message_ids = vec![source.to_string()];
    }
    svc.embed_memory(&mut m).await;
    let up = store::upsert(&svc.pool, m).await?;
    let blob = rebuild_blob(svc, scope).await?;
    Ok(json!({"memory_id": up.id(), "upsert": up, "blob": blob}))
}

async fn forget(
    svc: &MemoryService,
    scope: &Scope,
    payload: &serde_json::Value,
) -> Result<serde_json::Value> {
    let text = job_text(payload, "forget")?;
    let matched: Vec<i64> = forget_matches(svc, scope, text)
        .await?
        .iter()
        .map(|m| m.id)
        .collect();
    let archived = if matched.is_empty() {
        Vec::new()
    } else {
        store::archive_ids(&svc.pool, &scope.user_id, &matched).await?
    };
    let blob = rebuild_blob(svc, scope).await?;
    Ok(json!({"found": !archived.is_empty(), "archived": archived, "blob": blob}))
}

/// The active memories a forget of `text` archives: enough shared words, or a close vector.
/// Read-only, so a chat turn can say what a forget will do before the lane does it.
pub async fn forget_matches(
    svc: &MemoryService,
    scope: &Scope,
    text: &str,
) -> Result<Vec<store::Memory>> {
    let facts = store::facts(&svc.pool, scope, None, 5000).await?;
    let words = content_words(text);
    let model = svc.model_id();
    let qv = if facts.iter().any(|f| f.vector_of(model).is_some()) {
        svc.embed(vec![store::embed_text("other", text, None)], Role::Query)
            .await
            .and_then(|mut v| v.pop())
    } else {
        None
    };
    Ok(facts
        .into_iter()
        .filter(|f| {
            let lex = overlap(&words, text, &f.text);
            let cos = match (&qv, f.vector_of(model)) {
                (Some(q), Some(b)) => embed::dot_bytes(q, b) as f64,
                _ => 0.0,
            };
            lex >= FORGET_OVERLAP || cos >= FORGET_COSINE
        })
        .collect())
}

/// Runs memory jobs until none is runnable (CLI and tests; the worker calls
/// [`process_next_memory_job`] between turns instead). A lost claim race is retried, not
/// listed: callers look for their own jobs' outcomes.
pub async fn drain(svc: &MemoryService) -> Result<Vec<Outcome>> {
    let mut out = lane::drain(svc).await?;
    out.retain(|o| *o != Outcome::Busy);
    Ok(out)
}

/// Curator pass: folds near-duplicate current facts of one user (same kind, normalised
/// texts nearly equal or vectors >= 0.95). The best-placed fact is kept (pinned,
/// importance, newest), becomes `curated_fold` with the group's provenance, and the
/// others are archived. Returns the archived ids.
pub async fn curate(svc: &MemoryService, scope: &Scope) -> Result<Vec<i64>> {
    let facts = store::facts(&svc.pool, scope, None, 5000).await?;
    let mut folded: Vec<i64> = Vec::new();
    let mut used = vec![false; facts.len()];
    for i in 0..facts.len() {
        if used[i] {
            continue;
        }
        let mut group = vec![i];
        for j in (i + 1)..facts.len() {
            if used[j] || facts[j].kind != facts[i].kind {
                continue;
            }
            let wi = content_words(&facts[i].text);
            let wj = content_words(&facts[j].text);
            let inter = wi.iter().filter(|w| wj.contains(w)).count() as f64;
            let union = (wi.len() + wj.len()) as f64 - inter;
            let jacc = if union > 0.0 { inter / union } else { 0.0 };
            let model = svc.model_id();
            let cos = match (facts[i].vector_of(model), facts[j].vector_of(model)) {
                (Some(a), Some(b)) => {
                    embed::dot(&embed::from_bytes(a), &embed::from_bytes(b)) as f64
                }
                _ => 0.0,
            };
            if jacc >= 0.85 || cos >= 0.95 {
                group.push(j);
            }
        }
        if group.len() < 2 {
            continue;
        }
        // facts are ordered pinned, importance, newest: the first is the keeper.
        let keep = &facts[group[0]];
        let ids: Vec<String> = group
            .iter()
            .flat_map(|&g| facts[g].source_message_ids.clone())
            .collect();
        let imp = group
            .iter()
            .map(|&g| facts[g].importance)
            .max()
            .unwrap_or(1);
        let drop: Vec<i64> = group[1..].iter().map(|&g| facts[g].id).collect();
        // Transaction scope: one folded group (keeper updated, duplicates archived).
        let mut tx = svc.pool.begin().await?;
        sqlx::query(include_str!("../../../sql/memory/curate_set_fold.sql"))
            .bind(keep.id)
            .bind(&ids)
            .bind(imp)
            .execute(&mut *tx)
            .await?;
        let archived: Vec<i64> =
            sqlx::query_scalar(include_str!("../../../sql/memory/archive_ids.sql"))
                .bind(&scope.user_id)
                .bind(&drop)
                .fetch_all(&mut *tx)
                .await?;
        tx.commit().await?;
        for &g in &group {
            used[g] = true;
        }
        folded.extend(archived);
    }
    Ok(folded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cleaning_follows_seed_002() {
        assert_eq!(clean("  hi \n there  ").as_deref(), Some("hi there"));
        assert_eq!(clean(" ok "), None);
        assert_eq!(clean(&"x".repeat(400)).unwrap().len(), 320);
    }
}
