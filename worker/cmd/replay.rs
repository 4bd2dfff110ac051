//! Batch replay: re-run recorded sessions' user messages into fresh sessions on the
//! `replay` lane and compare the replies. With greedy decoding and the same model and
//! config, replies must be identical, so replay is the regression test for a model or
//! config change.

use std::path::Path;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use crate::context::digest;
use crate::queue::{self, LogStart, QueueError};

/// One session to replay.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Scene {
    /// The recorded session id (or a name for a JSONL scene).
    pub session_id: String,
    pub user_id: String,
    pub character_id: i64,
    pub messages: Vec<String>,
    /// The recorded replies, when known, to compare against.
    #[serde(default)]
    pub replies: Vec<String>,
    /// How each recorded turn's KV started, when known (not in JSONL scenes).
    #[serde(default)]
    pub starts: Vec<Option<TurnStart>>,
    /// The source's facts changed while it ran: the replay starts from their current values.
    #[serde(default)]
    pub facts_changed: bool,
}

/// How a turn's KV started: warm, or cold with why and how the dialogue was rebuilt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnStart {
    pub cold: bool,
    pub cold_reason: Option<String>,
    /// `exact` (recorded tokens) or `text` (re-tokenized dialogue), for a cold start.
    pub rebuild: Option<String>,
}

impl TurnStart {
    /// How a turn started, from its log row's start columns; `None` when the turn has no OK
    /// log row.
    fn from_log(cols: LogStart) -> Option<TurnStart> {
        Some(TurnStart {
            cold: cols.cold?,
            cold_reason: cols.cold_reason,
            rebuild: cols.rebuild,
        })
    }

    /// `warm`, `cold (exact)` or `cold (text): <reason>`: the table's start column.
    fn label(start: Option<&TurnStart>) -> String {
        match start {
            None => "-".to_string(),
            Some(s) if !s.cold => "warm".to_string(),
            Some(s) => {
                let how = s.rebuild.as_deref().unwrap_or("?");
                match &s.cold_reason {
                    Some(why) => format!("cold ({how}): {why}"),
                    None => format!("cold ({how})"),
                }
            }
        }
    }
}

/// One replayed turn.
#[derive(Debug, Clone, Serialize)]
pub struct TurnReport {
    pub source_session: String,
    pub replay_session: String,
    pub index: usize,
    pub turn_id: i64,
    pub state: String,
    pub latency_ms: Option<i32>,
    pub cold: Option<bool>,
    /// How the replayed turn's KV started.
    pub start: Option<TurnStart>,
    /// How the recorded turn's KV started.
    pub original_start: Option<TurnStart>,
    /// The latest recorded turn at or before this one that started cold after the first
    /// turn (1-based): a divergence from here on may come from that cold start.
    pub after_original_cold: Option<usize>,
    pub original: Option<String>,
    pub reply: Option<String>,
    /// `None` when there is no recorded reply to compare with.
    pub identical: Option<bool>,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub run_id: String,
    pub turns: Vec<TurnReport>,
    pub divergences: usize,
    pub failures: usize,
    pub elapsed_s: f64,
    /// What may explain divergences besides the model (facts that changed mid-session).
    pub notes: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("queue: {0}")]
    Queue(#[from] QueueError),
    #[error("reading scenes: {0}")]
    Io(#[from] std::io::Error),
    #[error("scene file line {line}: {error}")]
    Parse { line: usize, error: String },
    #[error("session {0} has no recorded turns")]
    UnknownSession(String),
    #[error("replay did not finish within {0} s")]
    Timeout(u64),
}

/// A queue read's error as a replay has always reported the database's ("database: …"),
/// not as a queueing error ("queue: database: …").
fn db(e: QueueError) -> ReplayError {
    match e {
        QueueError::Db(e) => ReplayError::Db(e),
        other => ReplayError::Queue(other),
    }
}

/// Reads recorded sessions from the database: their done turns, in order.
pub async fn scenes_from_db(pool: &PgPool, sessions: &[String]) -> Result<Vec<Scene>, ReplayError> {
    let mut scenes = Vec::new();
    for sid in sessions {
        let rows = queue::source_turns(pool, sid).await.map_err(db)?;
        let first = rows
            .first()
            .ok_or_else(|| ReplayError::UnknownSession(sid.clone()))?;
        let (user_id, character_id) = (first.user_id.clone(), first.character_id);
        let mut messages = Vec::with_capacity(rows.len());
        let mut replies = Vec::with_capacity(rows.len());
        let mut starts = Vec::with_capacity(rows.len());
        for r in rows {
            messages.push(r.message);
            replies.push(r.reply.unwrap_or_default());
            starts.push(TurnStart::from_log(r.start));
        }
        scenes.push(Scene {
            session_id: sid.clone(),
            user_id,
            character_id,
            messages,
            replies,
            starts,
            facts_changed: digest::facts_changed(pool, sid).await?,
        });
    }
    Ok(scenes)
}

/// Reads scenes from JSONL: one `Scene` object per line.
pub fn scenes_from_jsonl(path: &Path) -> Result<Vec<Scene>, ReplayError> {
    let text = std::fs::read_to_string(path)?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| ReplayError::Parse {
                line: i + 1,
                error: e.to_string(),
            })
        })
        .collect()
}

/// Queues every scene into a new session on the replay lane, waits for the workers, and
/// compares. The source session's current facts are copied, so the digest matches.
pub async fn run(
    pool: &PgPool,
    scenes: &[Scene],
    run_id: &str,
    timeout: Duration,
    progress: bool,
) -> Result<Report, ReplayError> {
    let started = Instant::now();
    let queued = queue_scenes(pool, scenes, run_id).await?;
    let ids: Vec<i64> = queued.iter().map(|q| q.id.0).collect();
    wait_for(pool, &ids, started, timeout, progress).await?;
    let mut turns = Vec::new();
    for q in queued {
        turns.push(compare(pool, q).await?);
    }
    Ok(Report {
        run_id: run_id.to_string(),
        divergences: turns.iter().filter(|t| t.identical == Some(false)).count(),
        failures: turns.iter().filter(|t| t.state != "done").count(),
        turns,
        elapsed_s: started.elapsed().as_secs_f64(),
        notes: scenes
            .iter()
            .filter(|s| s.facts_changed)
            .map(|s| {
                format!(
                    "{}: its facts changed while it ran; the replay used their current values, \
                     so its digest differs from the original's until the last change",
                    s.session_id
                )
            })
            .collect(),
    })
}

/// One queued replay turn: the scene's `index`-th message, as turn `id` of `target`.
struct Queued<'s> {
    scene: &'s Scene,
    target: String,
    index: usize,
    id: queue::TurnId,
}

/// Copies each scene's facts to its replay session and queues its messages there.
async fn queue_scenes<'s>(
    pool: &PgPool,
    scenes: &'s [Scene],
    run_id: &str,
) -> Result<Vec<Queued<'s>>, ReplayError> {
    let mut queued = Vec::new();
    for scene in scenes {
        let target = crate::turn::replay_session(run_id, &scene.session_id);
        digest::copy_facts(pool, &scene.session_id, &target).await?;
        for (index, msg) in scene.messages.iter().enumerate() {
            let key = format!("{target}:{index}");
            let turn = queue::NewTurn {
                session_id: &target,
                user_id: &scene.user_id,
                character_id: scene.character_id,
                message: msg,
                idempotency_key: Some(&key),
                options: None,
            };
            let id = queue::enqueue_on(pool, &turn, "replay").await?;
            queued.push(Queued {
                scene,
                target: target.clone(),
                index,
                id,
            });
        }
    }
    Ok(queued)
}

/// Waits until every turn of `ids` has finished, or `timeout` after `started`.
async fn wait_for(
    pool: &PgPool,
    ids: &[i64],
    started: Instant,
    timeout: Duration,
    progress: bool,
) -> Result<(), ReplayError> {
    let bar = if progress {
        ProgressBar::new(ids.len() as u64)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("replay {bar:40} {pos}/{len} turns ({elapsed}, eta {eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    loop {
        let finished = queue::finished_count(pool, ids).await.map_err(db)?;
        bar.set_position(finished as u64);
        if finished as usize == ids.len() {
            bar.finish();
            return Ok(());
        }
        if started.elapsed() > timeout {
            bar.abandon();
            return Err(ReplayError::Timeout(timeout.as_secs()));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A finished replay turn against the recorded one.
async fn compare(pool: &PgPool, q: Queued<'_>) -> Result<TurnReport, ReplayError> {
    let Queued {
        scene,
        target,
        index: i,
        id,
    } = q;
    let row = queue::replayed_turn(pool, id).await.map_err(db)?;
    let reply = row.reply;
    let original = scene.replies.get(i).cloned();
    Ok(TurnReport {
        source_session: scene.session_id.clone(),
        replay_session: target,
        index: i,
        turn_id: id.0,
        state: row.state,
        latency_ms: row.latency_ms,
        cold: row.start.cold,
        start: TurnStart::from_log(row.start),
        original_start: scene.starts.get(i).cloned().flatten(),
        after_original_cold: last_cold_start(&scene.starts[..scene.starts.len().min(i + 1)]),
        identical: original.as_ref().map(|o| Some(o) == reply.as_ref()),
        original,
        reply,
    })
}

/// The latest turn (1-based) after the first that started cold.
fn last_cold_start(starts: &[Option<TurnStart>]) -> Option<usize> {
    starts
        .iter()
        .enumerate()
        .skip(1)
        .rev()
        .find(|(_, s)| s.as_ref().is_some_and(|s| s.cold))
        .map(|(i, _)| i + 1)
}

/// A readable summary: one line per turn, and where diverging replies first differ.
pub fn summary(report: &Report) -> String {
    let after_cold = report
        .turns
        .iter()
        .filter(|t| t.identical == Some(false) && t.after_original_cold.is_some())
        .count();
    let mut out = format!(
        "replay {}: {} turns, {} identical, {} diverged ({} after a cold start in the original), {} failed, {:.1} s\n",
        report.run_id,
        report.turns.len(),
        report
            .turns
            .iter()
            .filter(|t| t.identical == Some(true))
            .count(),
        report.divergences,
        after_cold,
        report.failures,
        report.elapsed_s
    );
    for note in &report.notes {
        out.push_str(&format!("note: {note}\n"));
    }
    out.push_str(
        "| session | turn | state | original start | replay start | latency_ms | reply |\n\
         |---|---:|---|---|---|---:|---|\n",
    );
    for t in &report.turns {
        let verdict = match t.identical {
            Some(true) => "identical".to_string(),
            Some(false) => {
                let at = first_difference(
                    t.original.as_deref().unwrap_or(""),
                    t.reply.as_deref().unwrap_or(""),
                );
                match t.after_original_cold {
                    Some(turn) => format!(
                        "DIFFERS at char {at}, after the original's cold start at turn {turn}"
                    ),
                    None => format!("DIFFERS at char {at}"),
                }
            }
            None => "no original".to_string(),
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            t.source_session,
            t.index + 1,
            t.state,
            TurnStart::label(t.original_start.as_ref()),
            TurnStart::label(t.start.as_ref()),
            t.latency_ms.map_or("-".into(), |l| l.to_string()),
            verdict
        ));
    }
    for t in report.turns.iter().filter(|t| t.identical == Some(false)) {
        out.push_str(&format!(
            "\n{} turn {} (original start: {}; replay start: {}):\n- original: {:?}\n+ replay:   {:?}\n",
            t.source_session,
            t.index + 1,
            TurnStart::label(t.original_start.as_ref()),
            TurnStart::label(t.start.as_ref()),
            t.original.as_deref().unwrap_or(""),
            t.reply.as_deref().unwrap_or("")
        ));
    }
    out
}

fn first_difference(a: &str, b: &str) -> usize {
    a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count()
}
