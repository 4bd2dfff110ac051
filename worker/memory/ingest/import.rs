//! Bulk import of existing chat history (JSONL), so a character can search a user's past
//! before kvmem ever ran a turn: idempotent by the caller's message id, embedded and
//! committed in chunks, bad lines reported by number and never half-imported.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::io::BufRead;
use std::path::Path;
use std::time::Instant;

use chrono::{DateTime, Utc};
use pgvector::Vector;
use serde::{Deserialize, Serialize};

use crate::memory::columns::Columns;
use crate::memory::embed::{to_bytes, Role};
use crate::memory::error::{MemoryError, Result};
use crate::memory::search::{message_key, spans};
use crate::memory::service::MemoryService;
use crate::memory::store::embed_text;

/// Lines per transaction (and per embedding call group).
const CHUNK: usize = 256;
const MAX_TEXT: usize = 20_000;

/// Whether import runs the LLM extractor over the messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ExtractMode {
    /// Index for search only (full text + vectors).
    None,
    /// Also queue every message for fact extraction on the memory lane.
    Llm,
}

#[derive(Deserialize)]
struct RawLine {
    user_id: serde_json::Value,
    #[serde(default)]
    character_id: Option<i64>,
    #[serde(default)]
    guild_id: Option<serde_json::Value>,
    #[serde(default)]
    channel_id: Option<serde_json::Value>,
    session_id: serde_json::Value,
    message_id: serde_json::Value,
    speaker: String,
    text: String,
    at: String,
}

/// A validated line.
#[derive(Debug, Clone)]
pub struct ImportLine {
    pub line: usize,
    pub user_id: String,
    pub character_id: Option<i64>,
    pub guild_id: Option<String>,
    pub channel_id: Option<String>,
    pub session_id: String,
    pub message_id: String,
    pub speaker: String,
    pub text: String,
    pub at: DateTime<Utc>,
    pub context: Option<String>,
}

/// Why a line is rejected: the report lists it as `line N: {this}` and imports the rest.
#[derive(Debug, thiserror::Error)]
pub enum LineError {
    #[error("not a valid record: {0}")]
    NotARecord(#[source] serde_json::Error),
    #[error("{field} must be a string")]
    IdNotString { field: &'static str },
    #[error("{field} must not be empty")]
    IdEmpty { field: &'static str },
    #[error("{field} is longer than 200 characters")]
    IdTooLong { field: &'static str },
    #[error("at {at:?} is not RFC 3339 (e.g. 2024-05-03T10:00:00Z)")]
    NotRfc3339 { at: String },
    #[error("text is empty")]
    EmptyText,
    #[error("text is longer than {max} characters", max = MAX_TEXT)]
    TextTooLong,
    #[error("speaker is empty")]
    EmptySpeaker,
}

fn id_string(field: &'static str, v: &serde_json::Value) -> std::result::Result<String, LineError> {
    let s = match v {
        serde_json::Value::String(s) => s.trim().to_string(),
        serde_json::Value::Number(n) => n.to_string(),
        _ => return Err(LineError::IdNotString { field }),
    };
    if s.is_empty() {
        return Err(LineError::IdEmpty { field });
    }
    if s.len() > 200 {
        return Err(LineError::IdTooLong { field });
    }
    Ok(s)
}

/// RFC 3339; a timestamp without an offset is read as UTC rather than rejected, since
/// exports often drop the `Z`.
fn parse_at(raw: &str) -> std::result::Result<DateTime<Utc>, LineError> {
    let t = raw.trim();
    if let Ok(d) = DateTime::parse_from_rfc3339(t) {
        return Ok(d.with_timezone(&Utc));
    }
    for f in [
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%dT%H:%M",
    ] {
        if let Ok(n) = chrono::NaiveDateTime::parse_from_str(t, f) {
            return Ok(n.and_utc());
        }
    }
    Err(LineError::NotRfc3339 { at: raw.into() })
}

/// Parses and validates one line; the error says which field is wrong.
fn parse_line(line_no: usize, raw: &str) -> std::result::Result<ImportLine, LineError> {
    let r: RawLine = serde_json::from_str(raw).map_err(LineError::NotARecord)?;
    let opt = |field: &'static str, v: &Option<serde_json::Value>| match v {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => id_string(field, v).map(Some),
    };
    let at = parse_at(&r.at)?;
    let text = r.text.trim().to_string();
    if text.is_empty() {
        return Err(LineError::EmptyText);
    }
    if text.chars().count() > MAX_TEXT {
        return Err(LineError::TextTooLong);
    }
    let speaker = r.speaker.trim().to_string();
    if speaker.is_empty() {
        return Err(LineError::EmptySpeaker);
    }
    Ok(ImportLine {
        line: line_no,
        user_id: id_string("user_id", &r.user_id)?,
        character_id: r.character_id,
        guild_id: opt("guild_id", &r.guild_id)?,
        channel_id: opt("channel_id", &r.channel_id)?,
        session_id: id_string("session_id", &r.session_id)?,
        message_id: id_string("message_id", &r.message_id)?,
        speaker,
        text,
        at,
        context: None,
    })
}

/// What an import did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ImportReport {
    pub lines: usize,
    pub imported: usize,
    pub skipped_duplicate: usize,
    pub rejected: usize,
    /// `line N: reason`, at most the first 100.
    pub rejections: Vec<String>,
    pub embedded: usize,
    /// Existing messages that got their missing vector on this run.
    pub backfilled: usize,
    /// Messages that got their span vector (the turn with the four before it).
    pub spans_embedded: usize,
    pub queued_for_extraction: usize,
    pub semantic: bool,
    pub seconds: f64,
    pub messages_per_second: f64,
}

/// Imports a JSONL file. Every valid line is imported (or skipped as a duplicate); every
/// bad line is rejected with its number and reason. With `strict`, any bad line aborts
/// the import before anything is written.
pub async fn import_file(
    svc: &MemoryService,
    path: &Path,
    mode: ExtractMode,
    strict: bool,
    progress: bool,
) -> Result<ImportReport> {
    let started = Instant::now();
    let mut report = ImportReport {
        semantic: svc.embedder.is_some(),
        ..ImportReport::default()
    };
    let lines = read_lines(path, &mut report)?;
    if strict && report.rejected > 0 {
        return Err(MemoryError::Invalid(format!(
            "{} bad line(s), nothing imported (--strict):\n{}",
            report.rejected,
            report.rejections.join("\n")
        )));
    }
    let bar = progress_bar(lines.len(), progress);
    let mut new_ids: Vec<i64> = Vec::new();
    for chunk in lines.chunks(CHUNK) {
        let (ins, dup, emb, back) = import_chunk(svc, chunk, &mut new_ids).await?;
        report.imported += ins;
        report.skipped_duplicate += dup;
        report.embedded += emb;
        report.backfilled += back;
        bar.inc(chunk.len() as u64);
    }
    bar.finish_and_clear();
    // Spans last: each needs the turns before it, which later chunks may have brought.
    let users: BTreeSet<&str> = lines.iter().map(|l| l.user_id.as_str()).collect();
    for user in users {
        report.spans_embedded += spans::fill(svc, Some(user), None).await?;
    }
    if mode == ExtractMode::Llm && !new_ids.is_empty() {
        let queued: Vec<Option<i64>> =
            sqlx::query_scalar(include_str!("../../../sql/memory/queue_ingest_many.sql"))
                .bind(&new_ids)
                .fetch_all(&svc.pool)
                .await?;
        report.queued_for_extraction = queued.iter().flatten().count();
    }
    report.seconds = started.elapsed().as_secs_f64();
    report.messages_per_second = if report.seconds > 0.0 {
        (report.imported + report.skipped_duplicate) as f64 / report.seconds
    } else {
        0.0
    };
    Ok(report)
}

/// The file's valid lines, each new (user, message id) once and with the message before it
/// in its session as context; duplicates and bad lines are counted in `report`.
fn read_lines(path: &Path, report: &mut ImportReport) -> Result<Vec<ImportLine>> {
    let file = std::fs::File::open(path)
        .map_err(|e| MemoryError::Invalid(format!("cannot open {}: {e}", path.display())))?;
    let mut lines: Vec<ImportLine> = Vec::new();
    let mut seen: HashSet<(String, String)> = HashSet::new();
    let mut last_in_session: HashMap<(String, String), String> = HashMap::new();
    for (i, raw) in std::io::BufReader::new(file).lines().enumerate() {
        let n = i + 1;
        let raw = raw.map_err(|e| MemoryError::Invalid(format!("line {n}: cannot read: {e}")))?;
        if raw.trim().is_empty() {
            continue;
        }
        report.lines += 1;
        match parse_line(n, &raw) {
            Ok(mut l) => {
                if !seen.insert((l.user_id.clone(), l.message_id.clone())) {
                    report.skipped_duplicate += 1;
                    continue;
                }
                let sk = (l.user_id.clone(), l.session_id.clone());
                l.context = last_in_session.insert(sk, format!("{}: {}", l.speaker, l.text));
                lines.push(l);
            }
            Err(reason) => {
                report.rejected += 1;
                if report.rejections.len() < 100 {
                    report.rejections.push(format!("line {n}: {reason}"));
                }
            }
        }
    }
    Ok(lines)
}

fn progress_bar(len: usize, shown: bool) -> indicatif::ProgressBar {
    if !shown {
        return indicatif::ProgressBar::hidden();
    }
    let b = indicatif::ProgressBar::new(len as u64);
    b.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} importing [{bar:40}] {pos}/{len} {per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    b
}

/// A chunk's message already stored, and what backfilling its vector needs.
#[derive(sqlx::FromRow)]
struct Existing {
    id: i64,
    user_id: String,
    message_id: String,
    unembedded: bool,
    speaker: String,
    text: String,
    context: Option<String>,
}

/// One chunk: skip stored ids, embed the rest in batches, insert in one transaction.
async fn import_chunk(
    svc: &MemoryService,
    chunk: &[ImportLine],
    new_ids: &mut Vec<i64>,
) -> Result<(usize, usize, usize, usize)> {
    let users: Vec<&str> = chunk.iter().map(|l| l.user_id.as_str()).collect();
    let mids: Vec<&str> = chunk.iter().map(|l| l.message_id.as_str()).collect();
    let existing = sqlx::query_as::<_, Existing>(
        svc.columns()
            .sql(include_str!("../../../sql/memory/import_existing.sql")),
    )
    .bind(&users)
    .bind(&mids)
    .fetch_all(&svc.pool)
    .await?;
    let stored: HashSet<(String, String)> = existing
        .iter()
        .map(|r| (r.user_id.clone(), r.message_id.clone()))
        .collect();
    let fresh: Vec<&ImportLine> = chunk
        .iter()
        .filter(|l| !stored.contains(&(l.user_id.clone(), l.message_id.clone())))
        .collect();
    // Stored messages still without a vector get one now (a later run backfills).
    let missing: Vec<(i64, String)> = existing
        .iter()
        .filter(|r| r.unembedded)
        .map(|r| (r.id, message_key(&r.speaker, &r.text, r.context.as_deref())))
        .collect();
    let (embedded_any, fresh_vecs, back_vecs) = embed_chunk(svc, &fresh, &missing).await;
    // Transaction scope: one chunk of new messages and the chunk's vector backfill.
    let mut tx = svc.pool.begin().await?;
    let ids = insert_fresh(svc, &mut tx, &fresh, &fresh_vecs, embedded_any).await?;
    if !back_vecs.is_empty() {
        sqlx::query(
            svc.columns()
                .sql(include_str!("../../../sql/memory/set_message_vectors.sql")),
        )
        .bind(missing.iter().map(|m| m.0).collect::<Vec<_>>())
        .bind(&back_vecs)
        .bind(svc.model_id())
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    let inserted = ids.len();
    new_ids.extend(&ids);
    let embedded = if embedded_any { inserted } else { 0 };
    Ok((inserted, chunk.len() - inserted, embedded, back_vecs.len()))
}

/// The vectors of a chunk's new lines and of its stored messages without one, in one
/// batch; whether the embedder gave any.
async fn embed_chunk(
    svc: &MemoryService,
    fresh: &[&ImportLine],
    missing: &[(i64, String)],
) -> (bool, Vec<Option<Vector>>, Vec<Vector>) {
    let mut texts: Vec<String> = fresh
        .iter()
        .map(|l| message_key(&l.speaker, &l.text, l.context.as_deref()))
        .collect();
    texts.extend(missing.iter().map(|m| m.1.clone()));
    let vecs = if texts.is_empty() {
        None
    } else {
        svc.embed(texts, Role::Passage).await
    };
    match &vecs {
        Some(v) => (
            true,
            v[..fresh.len()]
                .iter()
                .map(|x| Some(Vector::from(x.clone())))
                .collect(),
            v[fresh.len()..]
                .iter()
                .map(|x| Vector::from(x.clone()))
                .collect(),
        ),
        None => (false, vec![None; fresh.len()], Vec::new()),
    }
}

/// Inserts a chunk's new lines with their vectors (if `embedded`, of the service's model).
async fn insert_fresh(
    svc: &MemoryService,
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    fresh: &[&ImportLine],
    fresh_vecs: &[Option<Vector>],
    embedded: bool,
) -> Result<Vec<i64>> {
    let model = if embedded { svc.model_id() } else { None };
    Ok(sqlx::query_scalar(
        svc.columns()
            .sql(include_str!("../../../sql/memory/import_insert.sql")),
    )
    .bind(fresh.iter().map(|l| l.user_id.clone()).collect::<Vec<_>>())
    .bind(fresh.iter().map(|l| l.character_id).collect::<Vec<_>>())
    .bind(fresh.iter().map(|l| l.guild_id.clone()).collect::<Vec<_>>())
    .bind(
        fresh
            .iter()
            .map(|l| l.channel_id.clone())
            .collect::<Vec<_>>(),
    )
    .bind(
        fresh
            .iter()
            .map(|l| l.session_id.clone())
            .collect::<Vec<_>>(),
    )
    .bind(
        fresh
            .iter()
            .map(|l| l.message_id.clone())
            .collect::<Vec<_>>(),
    )
    .bind(fresh.iter().map(|l| l.speaker.clone()).collect::<Vec<_>>())
    .bind(fresh.iter().map(|l| l.text.clone()).collect::<Vec<_>>())
    .bind(fresh.iter().map(|l| l.at).collect::<Vec<_>>())
    .bind(fresh.iter().map(|l| l.context.clone()).collect::<Vec<_>>())
    .bind(fresh_vecs)
    .bind(model)
    .fetch_all(&mut **tx)
    .await?)
}

/// A row a reindex embeds: where its kind is read and written, and the text its vector is
/// taken of. Messages and facts page, embed and commit alike; only these differ.
trait Unembedded: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin {
    /// The next chunk without a vector of the current model, for the embedder's `columns`:
    /// binds user, after id, limit, model.
    fn select(columns: Columns) -> &'static str;
    /// Writes the chunk's vectors into `columns`: binds ids, vectors, model.
    fn store(columns: Columns) -> &'static str;
    fn id(&self) -> i64;
    fn key(&self) -> String;
    /// The vectors as the store's column takes them.
    fn bind_vectors(q: PgQuery<'_>, vecs: Vec<Vec<f32>>) -> PgQuery<'_>;
}

type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// A message without a vector of the current model.
#[derive(sqlx::FromRow)]
struct UnembeddedMessage {
    id: i64,
    speaker: String,
    text: String,
    context: Option<String>,
}

impl Unembedded for UnembeddedMessage {
    fn select(columns: Columns) -> &'static str {
        columns.sql(include_str!("../../../sql/memory/unembedded_messages.sql"))
    }
    fn store(columns: Columns) -> &'static str {
        columns.sql(include_str!("../../../sql/memory/set_message_vectors.sql"))
    }
    fn id(&self) -> i64 {
        self.id
    }
    fn key(&self) -> String {
        message_key(&self.speaker, &self.text, self.context.as_deref())
    }
    fn bind_vectors(q: PgQuery<'_>, vecs: Vec<Vec<f32>>) -> PgQuery<'_> {
        q.bind(vecs.into_iter().map(Vector::from).collect::<Vec<Vector>>())
    }
}

/// A fact without a vector of the current model.
#[derive(sqlx::FromRow)]
struct UnembeddedFact {
    id: i64,
    fact_type: String,
    text: String,
    evidence_text: Option<String>,
}

impl Unembedded for UnembeddedFact {
    // Facts keep their vector in `memories.embedding` (bytea), of any width.
    fn select(_: Columns) -> &'static str {
        include_str!("../../../sql/memory/unembedded_memories.sql")
    }
    fn store(_: Columns) -> &'static str {
        include_str!("../../../sql/memory/set_memory_vectors.sql")
    }
    fn id(&self) -> i64 {
        self.id
    }
    fn key(&self) -> String {
        embed_text(&self.fact_type, &self.text, self.evidence_text.as_deref())
    }
    fn bind_vectors(q: PgQuery<'_>, vecs: Vec<Vec<f32>>) -> PgQuery<'_> {
        q.bind(vecs.iter().map(|v| to_bytes(v)).collect::<Vec<Vec<u8>>>())
    }
}

/// Gives every message, span and fact of `user` (all users: `None`) without a vector of the
/// current model one (`kvmem memory reindex`): the first fill, and after a switch of
/// embedder the vectors of the old model, which searches leave out until then. Each chunk
/// commits on its own, so a run that stops resumes where it was. Returns how many vectors
/// it wrote.
pub async fn reindex(svc: &MemoryService, user: Option<&str>, progress: bool) -> Result<usize> {
    let Some(model) = svc.model_id() else {
        return Err(MemoryError::Invalid(
            "no embedder loaded: set memory_embed_model_path to an embedder GGUF (ops/fetch-embedder)"
                .into(),
        ));
    };
    let (messages, spans_todo): (i64, i64) = sqlx::query_as(
        svc.columns()
            .sql(include_str!("../../../sql/memory/reindex_todo.sql")),
    )
    .bind(user)
    .bind(model)
    .fetch_one(&svc.pool)
    .await?;
    let facts: i64 = sqlx::query_scalar(include_str!("../../../sql/memory/reindex_todo_facts.sql"))
        .bind(user)
        .bind(model)
        .fetch_one(&svc.pool)
        .await?;
    let bar = if progress {
        let bar = indicatif::ProgressBar::new((messages + spans_todo + facts).max(0) as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg:>8} [{bar:40}] {pos}/{len} vectors, {per_sec}, {eta} left",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_message("messages");
    let mut done = reindex_rows::<UnembeddedMessage>(svc, user, &bar).await?;
    bar.set_message("spans");
    done += spans::fill_counting(svc, user, None, true, &|n| bar.inc(n as u64)).await?;
    bar.set_message("facts");
    done += reindex_rows::<UnembeddedFact>(svc, user, &bar).await?;
    bar.finish_and_clear();
    Ok(done)
}

/// Stored texts' vectors for a reindex, which cannot go on without them.
async fn passages(svc: &MemoryService, texts: Vec<String>) -> Result<Vec<Vec<f32>>> {
    svc.embed(texts, Role::Passage)
        .await
        .ok_or_else(|| MemoryError::Invalid("embedding failed (see events)".into()))
}

/// Every row of one kind without a vector of the current model gets one, a chunk at a
/// time in id order; each chunk commits on its own.
async fn reindex_rows<R: Unembedded>(
    svc: &MemoryService,
    user: Option<&str>,
    bar: &indicatif::ProgressBar,
) -> Result<usize> {
    let mut after = 0i64;
    let mut done = 0;
    loop {
        let rows: Vec<R> = sqlx::query_as(R::select(svc.columns()))
            .bind(user)
            .bind(after)
            .bind(CHUNK as i64)
            .bind(svc.model_id())
            .fetch_all(&svc.pool)
            .await?;
        let Some(last) = rows.last() else {
            return Ok(done);
        };
        after = last.id();
        let ids: Vec<i64> = rows.iter().map(R::id).collect();
        let vecs = passages(svc, rows.iter().map(R::key).collect()).await?;
        R::bind_vectors(sqlx::query(R::store(svc.columns())).bind(&ids), vecs)
            .bind(svc.model_id())
            .execute(&svc.pool)
            .await?;
        done += ids.len();
        bar.inc(ids.len() as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_and_fail_with_the_field_named() {
        let l = parse_line(1, r#"{"user_id":"u","session_id":3,"message_id":"m","speaker":"A","text":" hi there ","at":"2024-05-03T10:00:00+02:00"}"#).unwrap();
        assert_eq!((l.session_id.as_str(), l.text.as_str()), ("3", "hi there"));
        assert_eq!(l.at.to_rfc3339(), "2024-05-03T08:00:00+00:00");
        let naive = parse_line(1, r#"{"user_id":"u","session_id":"s","message_id":"m","speaker":"A","text":"x","at":"2024-05-03T10:00:00"}"#).unwrap();
        assert_eq!(naive.at.to_rfc3339(), "2024-05-03T10:00:00+00:00");
        let e = parse_line(1, r#"{"user_id":"u","session_id":"s","message_id":"","speaker":"A","text":"x","at":"2024-05-03T10:00:00Z"}"#).unwrap_err().to_string();
        assert_eq!(e, "message_id must not be empty");
        let e = parse_line(1, r#"{"user_id":"u","session_id":"s","message_id":"m","speaker":"A","text":"x","at":"May 3"}"#).unwrap_err().to_string();
        assert!(e.starts_with("at \"May 3\" is not RFC 3339"), "{e}");
    }
}
