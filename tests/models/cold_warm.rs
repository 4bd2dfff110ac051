//! A lost snapshot must not change the conversation: a cold start rebuilds the dialogue the
//! warm KV holds, token for token and segment for segment, so greedy replies after a
//! deleted, corrupted or stale snapshot match an uninterrupted warm run. On the tiny model
//! and on SmolLM2, in a session that prunes past its tail, with a digest that changes.

use crate::common;

use std::time::Duration;

use common::*;
use kvmem::runner::{self, Deps};
use kvmem::snapshot;
use serde_json::json;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

/// What happens to the session's snapshot file just before a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loss {
    Deleted,
    /// One byte of the payload flipped: the CRC refuses it.
    Corrupted,
    /// An older snapshot of the same session put back in place.
    Stale,
}

/// How the session's facts move while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum World {
    /// The digest appears at turn 2 and changes at turn 5.
    Changing,
    /// Set once before the first turn (a replay copies the facts as they are now).
    Steady,
}

/// One committed turn as the database recorded it.
#[derive(Debug)]
struct Turn {
    reply: String,
    tokens: Vec<i32>,
    segments: String,
    cold: bool,
    cold_reason: Option<String>,
    rebuild: Option<String>,
}

const MESSAGES: [&str; 10] = [
    "We just landed on the ice moon. Tell me what the scanner shows outside the hatch.",
    "Good. Check the oxygen reserves and tell me how many hours we have left on them.",
    "Something moved behind the ridge to the north. What do you think it could be?",
    "Let us walk towards the ridge slowly. Describe the ground under our boots.",
    "There is a metal door half buried in the snow. Can you read the markings on it?",
    "I am opening the door now. Stay close and tell me what you hear inside.",
    "The corridor splits in two. Which way should we go, left or right, and why?",
    "We found a sleeping crew in cryo pods. Should we wake them up or leave them?",
    "One of the pods is already open and empty. What does that make you think?",
    "We should head back to the ship before the storm. Summarise what we found today.",
];

/// The turn before which each loss happens, and the turn whose snapshot a stale loss puts
/// back. The first loss comes after the tail has been pruned (asserted below).
const LOSSES: [(usize, Loss); 3] = [(4, Loss::Deleted), (6, Loss::Corrupted), (8, Loss::Stale)];
const STALE_SOURCE: usize = 5;

fn scene_settings(dir: &std::path::Path, kv_type: &str) -> kvmem::config::Settings {
    // A tail of 200 tokens prunes the first exchanges within four turns.
    settings(json!({
        "kv_dir": dir, "n_ctx": 1024, "kv_tail_tokens": 200, "reply_max_tokens": 24,
        "kv_type": kv_type,
    }))
}

/// Runs the scene in session `sid`, applying `losses`, and reads back every turn.
async fn converse(
    deps: &Deps,
    dir: &std::path::Path,
    user: &str,
    sid: &str,
    ch: i64,
    world: World,
    losses: &[(usize, Loss)],
) -> Vec<Turn> {
    let file = dir.join(format!("{}.llkv", snapshot::scope_key(user, ch, sid)));
    let mut stale_copy = None;
    let mut turns = Vec::new();
    for (i, msg) in MESSAGES.iter().enumerate() {
        let site = match (world, i) {
            (World::Steady, 0) => Some("a buried station on the ice moon"),
            (World::Changing, 2) => Some("the north ridge of the ice moon"),
            (World::Changing, 5) => Some("a buried station on the ice moon"),
            _ => None,
        };
        if let Some(site) = site {
            fact(&deps.pool, sid, "location", "site", site).await;
        }
        match losses.iter().find(|(at, _)| *at == i).map(|(_, l)| *l) {
            Some(Loss::Deleted) => std::fs::remove_file(&file).unwrap(),
            Some(Loss::Corrupted) => {
                let mut bytes = std::fs::read(&file).unwrap();
                let at = bytes.len() - 100;
                bytes[at] ^= 0x5a;
                std::fs::write(&file, bytes).unwrap();
            }
            Some(Loss::Stale) => {
                std::fs::write(&file, stale_copy.as_ref().expect("a stale copy")).unwrap()
            }
            None => {}
        }
        let (id, log) = one_turn(deps, sid, user, ch, msg).await;
        assert_eq!(log.status, "OK", "{sid} turn {i}: {:?}", log.error);
        if i == STALE_SOURCE {
            stale_copy = Some(std::fs::read(&file).unwrap());
        }
        let (reply, tokens, segments, rebuild): (String, Vec<i32>, String, Option<String>) =
            sqlx::query_as(
                "SELECT t.reply, k.token_ids, k.segments,
                        (SELECT rebuild FROM turn_log WHERE turn_id = t.id ORDER BY id DESC LIMIT 1)
                   FROM turns t JOIN session_kv k ON k.session_id = t.session_id AND k.turn_id = t.id
                  WHERE t.id = $1",
            )
            .bind(id.0)
            .fetch_one(&deps.pool)
            .await
            .expect("the committed turn and its recorded KV dialogue");
        turns.push(Turn {
            reply,
            tokens,
            segments,
            cold: log.cold,
            cold_reason: log.cold_reason,
            rebuild,
        });
    }
    turns
}

/// A segment table without the exchanges' turn ids, which differ between two sessions
/// holding the same dialogue.
fn untagged_turns(segments: &str) -> String {
    segments
        .split(',')
        .map(|s| match s.split_once('@') {
            Some((head, _)) if head.starts_with("T:") => head,
            _ => s,
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Exchanges in a recorded segment table (`T` segments).
fn exchanges(segments: &str) -> usize {
    segments.split(',').filter(|s| s.starts_with("T:")).count()
}

/// What a run checks beyond the lossy conversation: the replay of one (`Replay::Also`) is
/// the same code for every KV type, so one SmolLM2 run carries it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Replay {
    Also,
    Skip,
}

async fn cold_equals_warm(pool: PgPool, model: std::path::PathBuf, kv_type: &str, replay: Replay) {
    cold_equals_warm_with(pool, model, kv_type, replay, json!({})).await;
}

/// [`cold_equals_warm`] with more settings over the scene's (the GPU tests' `gpu_layers`).
/// Returns the engine the worker ran, so a caller can say where it ran.
pub(crate) async fn cold_equals_warm_with(
    pool: PgPool,
    model: std::path::PathBuf,
    kv_type: &str,
    replay: Replay,
    extra: serde_json::Value,
) -> std::sync::Arc<kvmem::engine::Engine> {
    migrate(&pool).await;
    // One user per conversation: recall searches a user's own past dialogue, so a second
    // conversation of the same user would recall the first, and they would differ for
    // that reason alone.
    let dir = tempfile::tempdir().unwrap();
    let s = scene_settings(dir.path(), kv_type).with(extra).unwrap();
    let engine = load_engine(&model, &s);
    let deps = llama_deps(&pool, s.clone(), engine.clone(), "w1");

    let ch = character(&pool, "u1", "Ada").await;
    let warm = converse(&deps, dir.path(), "u1", "warm", ch, World::Changing, &[]).await;
    let ch2 = character(&pool, "u2", "Ada").await;
    let lossy = converse(
        &deps,
        dir.path(),
        "u2",
        "lossy",
        ch2,
        World::Changing,
        &LOSSES,
    )
    .await;

    // The reference run is warm after its first turn, and pruned before the first loss.
    for (i, t) in warm.iter().enumerate().skip(1) {
        assert!(
            !t.cold,
            "warm run turn {i} started cold: {:?}",
            t.cold_reason
        );
    }
    let first_loss = LOSSES[0].0;
    assert!(
        exchanges(&warm[first_loss - 1].segments) < first_loss,
        "the KV was not pruned before turn {first_loss}: {}",
        warm[first_loss - 1].segments
    );
    assert!(
        warm.iter().any(|t| t.segments.contains("D:")),
        "no digest reached the KV"
    );

    // Every loss made exactly one cold start, each rebuilt from the recorded dialogue.
    let cold: Vec<(usize, Option<&str>)> = lossy
        .iter()
        .enumerate()
        .skip(1)
        .filter(|(_, t)| t.cold)
        .map(|(i, t)| (i, t.rebuild.as_deref()))
        .collect();
    let expected: Vec<(usize, Option<&str>)> =
        LOSSES.iter().map(|(i, _)| (*i, Some("exact"))).collect();
    assert_eq!(
        cold,
        expected,
        "reasons: {:?}",
        lossy.iter().map(|t| &t.cold_reason).collect::<Vec<_>>()
    );
    assert!(lossy[LOSSES[1].0]
        .cold_reason
        .as_deref()
        .unwrap()
        .contains("corrupt"));
    assert!(lossy[LOSSES[2].0]
        .cold_reason
        .as_deref()
        .unwrap()
        .contains("stale"));

    // Token for token: the KV's dialogue and every reply match the uninterrupted run.
    for (i, (w, l)) in warm.iter().zip(&lossy).enumerate() {
        assert_eq!(
            untagged_turns(&l.segments),
            untagged_turns(&w.segments),
            "turn {i}: segment tables differ"
        );
        assert_eq!(l.tokens, w.tokens, "turn {i}: KV tokens differ");
        assert_eq!(l.reply, w.reply, "turn {i}: replies differ");
    }

    if replay == Replay::Also {
        replay_reproduces_a_lossy_session(&pool, &deps, dir.path(), s, engine.clone()).await;
    }
    engine
}

/// A replay of a lossy session reproduces it, and shows where the original was cold.
async fn replay_reproduces_a_lossy_session(
    pool: &PgPool,
    deps: &Deps,
    dir: &std::path::Path,
    s: kvmem::config::Settings,
    engine: std::sync::Arc<kvmem::engine::Engine>,
) {
    let ch3 = character(pool, "u3", "Ada").await;
    converse(deps, dir, "u3", "steady", ch3, World::Steady, &LOSSES).await;
    let replayer = llama_deps(
        pool,
        s.with(json!({ "lanes": ["replay"] })).unwrap(),
        engine,
        "replayer",
    );
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(runner::run(replayer, shutdown.clone()));
    let scenes = kvmem::cmd::replay::scenes_from_db(pool, &["steady".to_string()])
        .await
        .unwrap();
    let report = kvmem::cmd::replay::run(pool, &scenes, "r1", Duration::from_secs(600), false)
        .await
        .unwrap();
    shutdown.cancel();
    worker.await.unwrap().unwrap();
    let table = kvmem::cmd::replay::summary(&report);
    assert_eq!((report.divergences, report.failures), (0, 0), "{table}");
    for (at, _) in LOSSES {
        let original = report.turns[at].original_start.as_ref().unwrap();
        assert!(
            original.cold && original.rebuild.as_deref() == Some("exact"),
            "{table}"
        );
    }
    assert!(table.contains("cold (exact)"), "{table}");
    // A session whose facts moved is flagged: its replay starts from today's facts.
    assert!(!scenes[0].facts_changed && report.notes.is_empty());
    let moved = kvmem::cmd::replay::scenes_from_db(pool, &["lossy".to_string()])
        .await
        .unwrap();
    assert!(moved[0].facts_changed);
}

#[sqlx::test(migrations = false)]
async fn cold_equals_warm_on_the_tiny_model(pool: PgPool) {
    cold_equals_warm(pool, tiny_model(), "f16", Replay::Also).await;
}

#[sqlx::test(migrations = false)]
async fn cold_equals_warm_on_smollm2(pool: PgPool) {
    cold_equals_warm(pool, smollm2(), "f16", Replay::Also).await;
}

/// The production profile's KV type, which the speed figures use. The replay reads no KV
/// type of its own: the f16 run above carries it.
#[sqlx::test(migrations = false)]
async fn cold_equals_warm_on_smollm2_with_q8_0_kv(pool: PgPool) {
    cold_equals_warm(pool, smollm2(), "q8_0", Replay::Skip).await;
}
