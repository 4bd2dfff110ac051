//! llama.cpp's Vulkan backend (cargo feature `vulkan`), run by `ops/test-gpu` on lavapipe,
//! Mesa's software Vulkan driver: a session on the device resumes exactly from its
//! snapshot, a cold start on it rebuilds exactly, sessions decode together on it, and a
//! snapshot moves between the device and the CPU in both directions.

use crate::common;

use std::sync::Arc;

use common::*;
use kvmem::engine::{Engine, KvSession};
use kvmem::snapshot::{self, SegKind};
use serde_json::json;
use sqlx::PgPool;

/// All of a model's layers (and so its KV) on the first GPU.
const ALL: u32 = 999;

/// `model` with all its layers on the Vulkan device; fails when there is none (run these
/// through ops/test-gpu, which points the Vulkan loader at lavapipe).
fn on_vulkan(model: &std::path::Path, extra: serde_json::Value) -> Arc<Engine> {
    let s = settings(json!({ "n_ctx": 1024, "gpu_layers": ALL }))
        .with(extra)
        .unwrap();
    let engine = load_engine(model, &s);
    let p = &engine.placement;
    assert_eq!(
        p.backend, "Vulkan",
        "no Vulkan device (run ops/test-gpu): {p:?}"
    );
    assert_eq!(p.offloaded_layers, p.layers, "{p:?}");
    engine
}

fn on_cpu(model: &std::path::Path, extra: serde_json::Value) -> Arc<Engine> {
    let s = settings(json!({ "n_ctx": 1024, "gpu_layers": 0 }))
        .with(extra)
        .unwrap();
    let engine = load_engine(model, &s);
    assert_eq!(engine.placement.backend, "CPU");
    engine
}

#[test]
fn smollm2_on_vulkan_resumes_exactly() {
    let engine = on_vulkan(&smollm2(), json!({}));
    crate::engine::exact_resume_on(&engine, 120, 24);
}

#[test]
fn tiny_model_on_vulkan_resumes_exactly() {
    let engine = on_vulkan(&tiny_model(), json!({}));
    crate::engine::exact_resume_on(&engine, 160, 24);
}

/// Not the CPU's promise (a batched reply equals the reply alone): see
/// [`crate::batch::batched_on_a_device`] for what was measured and what holds.
#[test]
fn batched_sessions_on_vulkan_repeat_and_keep_their_own_prompts() {
    let engine = on_vulkan(&smollm2(), json!({ "kv_type": "q8_0" }));
    crate::batch::batched_on_a_device(&engine);
}

#[sqlx::test(migrations = false)]
async fn cold_equals_warm_on_vulkan(pool: PgPool) {
    let engine = crate::cold_warm::cold_equals_warm_with(
        pool,
        tiny_model(),
        "f16",
        crate::cold_warm::Replay::Skip,
        json!({ "gpu_layers": ALL }),
    )
    .await;
    assert_eq!(engine.placement.backend, "Vulkan");
}

/// A session's three turns on one engine: its state, tokens and segments, as a save
/// writes them.
struct Saved {
    state: Vec<u8>,
    ids: Vec<i32>,
    segments: Vec<snapshot::Segment>,
}

const HUDS: [&str; 4] = [
    "HUD: HP 90/100",
    "HUD: HP 89/100",
    "HUD: HP 88/100",
    "HUD: HP 80/100",
];
const MESSAGES: [&str; 4] = [
    "Hello, who are you?",
    "Where are we flying today?",
    "How is the engine?",
    "Tell me about the mission.",
];

fn three_turns(engine: &Engine) -> Saved {
    let mut ctx = engine.new_context().unwrap();
    let mut s = KvSession::empty(engine, &mut ctx);
    s.append(
        &engine.base_tokens("You are Ada, a pilot. Answer briefly."),
        Some(SegKind::Base),
    )
    .unwrap();
    for (hud, message) in HUDS.iter().zip(MESSAGES).take(3) {
        crate::engine::turn(engine, &mut s, hud, message, 24, 120);
    }
    Saved {
        state: s.export_state(),
        ids: s.token_ids(),
        segments: s.segments().to_vec(),
    }
}

/// The fourth turn after restoring `saved` into a fresh context of `engine`.
fn fourth(engine: &Engine, saved: &Saved) -> Result<Vec<i32>, String> {
    let mut ctx = engine.new_context().unwrap();
    let mut s = KvSession::restore(engine, &mut ctx, &saved.state, &saved.ids, &saved.segments)
        .map_err(|e| e.to_string())?;
    Ok(crate::engine::turn(
        engine,
        &mut s,
        HUDS[3],
        MESSAGES[3],
        24,
        120,
    ))
}

/// A KV moved between the Vulkan device and the CPU, both ways: llama.cpp writes the same
/// layout on both, so it loads; the values are each device's own arithmetic.
fn cross_device(model: &std::path::Path) -> [Vec<i32>; 4] {
    let gpu = on_vulkan(model, json!({}));
    let cpu = on_cpu(model, json!({}));
    let (g, c) = (three_turns(&gpu), three_turns(&cpu));
    let differing = g.state.iter().zip(&c.state).filter(|(a, b)| a != b).count();
    eprintln!(
        "{}: state bytes gpu {} cpu {}, same dialogue {}, differing bytes {differing}",
        model.display(),
        g.state.len(),
        c.state.len(),
        g.ids == c.ids,
    );
    let run = |engine: &Engine, saved: &Saved, what: &str| {
        let reply = fourth(engine, saved).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(!reply.is_empty(), "{what}: empty reply");
        eprintln!("{what} {reply:?}");
        reply
    };
    [
        run(&gpu, &g, "gpu->gpu"),
        run(&cpu, &g, "gpu->cpu"),
        run(&cpu, &c, "cpu->cpu"),
        run(&gpu, &c, "cpu->gpu"),
    ]
}

/// The tiny model's greedy replies are the same on both devices (measured: its three
/// turns and every fourth turn, though 10,338 of its 25,808 KV bytes differ), so a KV moved
/// either way gives the reply a warm resume on either device gives.
#[test]
fn snapshots_move_between_vulkan_and_the_cpu_tiny() {
    let [gg, gc, cc, cg] = cross_device(&tiny_model());
    assert_eq!(gc, gg, "a Vulkan KV resumed on the CPU");
    assert_eq!(cg, cc, "a CPU KV resumed on Vulkan");
    assert_eq!(gg, cc, "the two devices");
}

/// SmolLM2's greedy replies differ between the devices (measured: from the first turn's
/// tenth token), so no resume, warm or rebuilt, can promise the other device's reply. A
/// KV moved either way loads, and its reply starts as the warm resume on the device that
/// made the KV does (measured: Vulkan to the CPU 21 of 24 tokens alike, the CPU to Vulkan
/// all 24).
#[test]
fn snapshots_move_between_vulkan_and_the_cpu_smollm2() {
    let [gg, gc, cc, cg] = cross_device(&smollm2());
    assert_eq!(
        gc[0], gg[0],
        "a Vulkan KV resumed on the CPU: {gc:?} / {gg:?}"
    );
    assert_eq!(cg[0], cc[0], "a CPU KV resumed on Vulkan: {cg:?} / {cc:?}");
}
