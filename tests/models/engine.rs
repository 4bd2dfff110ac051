//! The engine on real GGUF models: save → load is exact, pruning and the ephemeral HUD keep
//! the KV consistent, and the chat template frames turns.

use crate::common;

use std::path::Path;
use std::sync::atomic::AtomicBool;

use common::*;
use kvmem::engine::{Engine, GenStats, KvSession};
use kvmem::snapshot::{self, Compression, Header, Limits, SegKind};

pub(crate) fn header() -> Header {
    Header {
        format_version: snapshot::FORMAT_VERSION,
        model_sha: String::new(),
        digest_version: String::new(),
        crc32c: 0,
        tokens: 0,
        bytes: 0,
        stored_bytes: 0,
        timestamp: 0,
        llama_build: kvmem::engine::LLAMA_BUILD.into(),
        n_ctx: 0,
        type_k: "f16".into(),
        type_v: "f16".into(),
        kv_device: snapshot::CPU_DEVICE.into(),
        compression: Compression::Zstd,
        scope: "t".into(),
        turn_id: 1,
        fence: 1,
        segments: Vec::new(),
    }
}

/// One turn the way the pipeline frames it: HUD + user, generate, drop the HUD, prune, close.
pub(crate) fn turn(
    engine: &Engine,
    s: &mut KvSession,
    hud: &str,
    user: &str,
    reply_max: u32,
    tail: u32,
) -> Vec<i32> {
    let never = AtomicBool::new(false);
    let hud_t = engine.block(&engine.frame.system, &[hud]);
    let user_t = engine.block(&engine.frame.user, &[user]);
    let close = engine.tokenize_special(&engine.frame.reply_close, false);
    let hud_start = s.len();
    s.append(&hud_t, Some(SegKind::Turn)).unwrap();
    s.append(&user_t, Some(SegKind::Turn)).unwrap();
    let reply = s
        .generate(reply_max, &never, &mut GenStats::default())
        .unwrap();
    s.remove(hud_start, hud_start + hud_t.len() as u32).unwrap();
    s.prune_to(tail - close.len() as u32).unwrap();
    s.append(&close, None).unwrap();
    reply.iter().map(|t| t.0).collect()
}

/// Runs three turns, saves through the LLKV1 format, then compares the fourth turn
/// continued in memory against the fourth turn after a restore into a fresh context.
fn exact_resume(model: &Path, tail: u32, reply_max: u32, kv_type: &str) {
    let settings = settings(serde_json::json!({ "n_ctx": 1024, "kv_type": kv_type }));
    exact_resume_on(&load_engine(model, &settings), tail, reply_max);
}

/// [`exact_resume`] on a loaded engine (the GPU tests load theirs on a device).
pub(crate) fn exact_resume_on(engine: &Engine, tail: u32, reply_max: u32) {
    let kv_type = engine.params.kv_type.as_str();
    let mut ctx_a = engine.new_context().unwrap();
    let mut a = KvSession::empty(engine, &mut ctx_a);
    a.append(
        &engine.base_tokens("You are Ada, a pilot. Answer briefly."),
        Some(SegKind::Base),
    )
    .unwrap();
    for (i, msg) in [
        "Hello, who are you?",
        "Where are we flying today?",
        "How is the engine?",
    ]
    .iter()
    .enumerate()
    {
        turn(
            engine,
            &mut a,
            &format!("HUD: HP {}/100", 90 - i),
            msg,
            reply_max,
            tail,
        );
        assert!(a.len() <= tail);
    }
    let mut h = header();
    (h.type_k, h.type_v) = (kv_type.into(), kv_type.into());
    h.segments = a.segments().to_vec();
    let file = snapshot::encode(&mut h, &a.token_ids(), &a.export_state()).unwrap();
    let snap = snapshot::decode(&file, Limits::LOOSE).unwrap();

    let in_memory = turn(
        engine,
        &mut a,
        "HUD: HP 80/100",
        "Tell me about the mission.",
        reply_max,
        tail,
    );
    drop(a);

    let mut ctx_b = engine.new_context().unwrap();
    let mut b = KvSession::restore(
        engine,
        &mut ctx_b,
        &snap.state,
        &snap.token_ids,
        &snap.header.segments,
    )
    .unwrap();
    let resumed = turn(
        engine,
        &mut b,
        "HUD: HP 80/100",
        "Tell me about the mission.",
        reply_max,
        tail,
    );
    assert!(!in_memory.is_empty());
    assert_eq!(
        in_memory, resumed,
        "greedy continuation differs after save/load"
    );
}

#[test]
fn tiny_model_resumes_exactly_after_pruning_and_hud_removal() {
    // A small tail forces pruning (and a position shift) before every save.
    exact_resume(&tiny_model(), 160, 24, "f16");
}

#[test]
fn smollm2_resumes_exactly() {
    // SmolLM2 is the sensitive check: a missed RoPE shift changes its greedy output.
    exact_resume(&smollm2(), 120, 24, "f16");
}

#[test]
fn smollm2_resumes_exactly_with_q8_0_kv() {
    // The production profile's KV type: the prune's position shift re-quantizes K.
    exact_resume(&smollm2(), 120, 24, "q8_0");
}

#[test]
fn restore_into_a_context_of_another_kv_type_is_refused() {
    let s16 = settings(serde_json::json!({ "n_ctx": 512 }));
    let engine = load_engine(&tiny_model(), &s16);
    let mut ctx = engine.new_context().unwrap();
    let mut a = KvSession::empty(&engine, &mut ctx);
    a.append(&engine.base_tokens("You are Ada."), Some(SegKind::Base))
        .unwrap();
    let state = a.export_state();
    let ids = a.token_ids();
    let segs = a.segments().to_vec();
    drop(a);
    let s32 = settings(serde_json::json!({ "n_ctx": 512, "kv_type": "f32" }));
    let engine32 = load_engine(&tiny_model(), &s32);
    let mut ctx32 = engine32.new_context().unwrap();
    assert!(KvSession::restore(&engine32, &mut ctx32, &state, &ids, &segs).is_err());
    // Truncated state is refused too, without a crash.
    let mut ctx = engine.new_context().unwrap();
    assert!(KvSession::restore(&engine, &mut ctx, &state[..state.len() / 2], &ids, &segs).is_err());
}

#[test]
fn prune_keeps_the_base_prefix_and_whole_segments() {
    let settings = settings(serde_json::json!({ "n_ctx": 1024 }));
    let engine = load_engine(&tiny_model(), &settings);
    let mut ctx = engine.new_context().unwrap();
    let mut s = KvSession::empty(&engine, &mut ctx);
    let base = engine.base_tokens("You are Ada.");
    s.append(&base, Some(SegKind::Base)).unwrap();
    for i in 0..10 {
        let t = engine.block(
            &engine.frame.exchange,
            &[&format!("question {i}"), &format!("answer {i}")],
        );
        s.append(&t, Some(SegKind::Turn)).unwrap();
    }
    let before = s.segments().to_vec();
    let dropped = s.prune_to(base.len() as u32 + 40).unwrap();
    assert!(dropped > 0);
    assert!(s.len() <= base.len() as u32 + 40);
    let ids = s.token_ids();
    assert_eq!(
        &ids[..base.len()],
        &base.iter().map(|t| t.0).collect::<Vec<_>>()[..]
    );
    // What is left is the newest segments, whole.
    let kept = &s.segments()[1..];
    assert_eq!(kept, &before[before.len() - kept.len()..]);
    let text = engine.detokenize(s.tokens());
    assert!(
        text.contains("answer 9") && !text.contains("answer 0"),
        "{text}"
    );
}

#[test]
fn prune_keeps_the_newest_digest_while_turns_can_go() {
    let settings = settings(serde_json::json!({ "n_ctx": 1024 }));
    let engine = load_engine(&tiny_model(), &settings);
    let mut ctx = engine.new_context().unwrap();
    let mut s = KvSession::empty(&engine, &mut ctx);
    let base = engine.base_tokens("You are Ada.");
    s.append(&base, Some(SegKind::Base)).unwrap();
    let turn = |i: usize| {
        engine.block(
            &engine.frame.exchange,
            &[&format!("question {i}"), &format!("answer {i}")],
        )
    };
    s.append(&turn(0), Some(SegKind::Turn)).unwrap();
    s.append(
        &engine.block(&engine.frame.system, &["World state: old"]),
        Some(SegKind::Digest),
    )
    .unwrap();
    s.append(&turn(1), Some(SegKind::Turn)).unwrap();
    s.append(
        &engine.block(&engine.frame.system, &["World state: new"]),
        Some(SegKind::Digest),
    )
    .unwrap();
    for i in 2..8 {
        s.append(&turn(i), Some(SegKind::Turn)).unwrap();
    }
    s.prune_to(s.len() - 20).unwrap();
    let text = engine.detokenize(s.tokens());
    assert!(text.contains("World state: new"), "{text}");
    assert!(
        !text.contains("World state: old") && !text.contains("answer 0"),
        "{text}"
    );
    assert!(text.starts_with(&engine.detokenize(&base)));
    assert_eq!(
        s.segments()
            .iter()
            .filter(|x| x.kind == SegKind::Digest)
            .count(),
        1
    );
}

#[test]
fn a_file_that_is_not_a_model_is_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("fake.gguf");
    std::fs::write(&fake, b"this is not a model").unwrap();
    let s = settings(serde_json::json!({}));
    let err =
        kvmem::system::load_engine(&fake, None, kvmem::engine::EngineParams::from_settings(&s))
            .err()
            .unwrap();
    assert!(err.to_string().contains("not a GGUF file"), "{err}");
    let err = kvmem::system::load_engine(
        &tiny_model(),
        Some(&"0".repeat(64)),
        kvmem::engine::EngineParams::from_settings(&s),
    )
    .err()
    .unwrap();
    assert!(err.to_string().contains("MODEL_SHA pins"), "{err}");
}

#[test]
fn engine_threads_report_a_state_that_cannot_be_built_from_start() {
    use kvmem::engine::threads::{EngineThreads, StartError};
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    let engine = load_engine(&tiny_model(), &settings(serde_json::json!({})));
    let made = Arc::new(AtomicU32::new(0));
    let counter = made.clone();
    let names = (0..3).map(|i| format!("kvmem-test-{i}"));
    let started = EngineThreads::start(engine, names, move |_: &Engine| {
        match counter.fetch_add(1, Ordering::SeqCst) {
            1 => Err("the second thread has no context"),
            n => Ok(n),
        }
    });
    match started {
        Err(StartError::Make(e)) => assert_eq!(e, "the second thread has no context"),
        Err(e) => panic!("{e:?}"),
        Ok(_) => panic!("started although a thread could not build its state"),
    }
    // Threads start one after another: the third was never started.
    assert_eq!(made.load(Ordering::SeqCst), 2);
}

#[test]
fn engine_threads_report_a_job_that_died_and_threads_that_are_gone() {
    use kvmem::engine::threads::{EngineThreads, RunError};

    let engine = load_engine(&tiny_model(), &settings(serde_json::json!({})));
    let names = std::iter::once("kvmem-test".to_string());
    let threads = EngineThreads::start(engine, names, |_: &Engine| Ok::<u32, String>(0)).unwrap();
    let name = threads.run_blocking(|_, state| {
        *state += 1;
        std::thread::current().name().map(str::to_string)
    });
    assert_eq!(name, Ok(Some("kvmem-test".to_string())));
    assert_eq!(threads.run_blocking(|_, state| *state), Ok(1));
    let died = threads.run_blocking(|_, _| -> u32 { panic!("a job panics") });
    assert_eq!(died, Err(RunError::Stopped));
    // No job waits for a thread that has ended: one queued while it unwinds is dropped
    // with the queue (stopped), one queued after finds no queue (gone).
    let after = threads.run_blocking(|_, state| *state);
    assert!(
        matches!(after, Err(RunError::Gone | RunError::Stopped)),
        "{after:?}"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while threads.run_blocking(|_, state| *state) != Err(RunError::Gone) {
        assert!(
            std::time::Instant::now() < deadline,
            "the queue outlived its thread"
        );
        std::thread::yield_now();
    }
}
