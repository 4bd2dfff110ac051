//! The `batch` suite: aggregate generated tokens/s with 1, 2, 4 and 8 sessions decoded
//! together (`KVMEM_BATCH_SESSIONS`), against the same warm turns run one at a time, in one
//! process and one run, on the engine alone (no queue, no database): what batching buys is
//! decided there.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use anyhow::{bail, Result};
use kvmem::config::Settings;
use kvmem::context::digest;
use kvmem::engine::{Contexts, Engine, EngineParams};
use kvmem::pipeline::history::Exchange;
use kvmem::pipeline::kv::{self, BatchTurn, ColdSource, KvOutcome, Start, TurnJob, TurnRun};
use kvmem::pipeline::recall::ContextBlock;
use kvmem::snapshot::{self, Header, Limits, Snapshot};
use serde_json::{json, Value};

use crate::{median, spread};

/// The characters the sessions play; a session's history and message vary with its index.
const PEOPLE: [(&str, &str); 8] = [
    ("Ada", "a pilot"),
    ("Brun", "a blacksmith"),
    ("Cass", "a ship's doctor"),
    ("Dov", "a cartographer"),
    ("Eda", "a smuggler"),
    ("Fenn", "a lighthouse keeper"),
    ("Gia", "a botanist"),
    ("Hal", "an engineer"),
];

const TOPICS: [&str; 8] = [
    "the storm over the northern sea",
    "the broken gate of the old fort",
    "the fever spreading in the lower deck",
    "the river that vanished last spring",
    "the cargo nobody will name",
    "the light that failed at midnight",
    "the seeds that glow in the dark",
    "the reactor's strange humming",
];

fn job(i: usize, turn_id: i64, message: String, reply_max: u32) -> TurnJob {
    let (name, role) = PEOPLE[i];
    TurnJob {
        turn_id,
        base_prompt: format!("You are {name}, {role}, in an ongoing story. Answer in detail."),
        hud: format!("HP {}/100, stress {}", 95 - i * 5, 10 + i * 3),
        digest: digest::Stored {
            version: digest::version_of(""),
            content: String::new(),
        },
        context: ContextBlock {
            content: String::new(),
            version: String::new(),
        },
        recall: Vec::new(),
        recall_max: 0,
        user: message,
        reply_prefix: String::new(),
        tail: 2000,
        reply_max,
        sampling: Default::default(),
        export: true,
        stream: None,
    }
}

fn ran(outcome: Result<KvOutcome, kvmem::turn::TurnError>) -> Result<TurnRun> {
    match outcome? {
        KvOutcome::Ran(run) => Ok(*run),
        KvOutcome::Refused(why) => bail!("snapshot refused: {why}"),
    }
}

/// The snapshot a save of `run` would write, decoded back.
fn snapshot_of(run: &TurnRun, turn_id: i64) -> Result<Snapshot> {
    let mut header = Header::new("", kvmem::engine::LLAMA_BUILD, &format!("bench{turn_id}"))
        .with_turn(turn_id, 1)
        .with_digest(&run.kv_digest_version)
        .with_segments(run.segments.clone());
    let state = run.state.as_deref().unwrap_or_default();
    let file = snapshot::encode(&mut header, &run.token_ids, state)?;
    Ok(snapshot::decode(&file, Limits::LOOSE)?)
}

/// One measured turn per session, and what the set of them cost.
struct Round {
    wall_ms: f64,
    /// Σ generated tokens.
    tokens: u32,
    /// Wall time of the generation phase: Σ over turns alone, first to last token together.
    gen_ms: f64,
    /// Each turn's latency, from the start of the set to its own end (alone: its own run).
    latencies: Vec<f64>,
    replies: Vec<String>,
}

fn alone(engine: &Engine, ctxs: &mut Contexts, turns: Vec<(TurnJob, Start)>) -> Result<Round> {
    let never = AtomicBool::new(false);
    let started = Instant::now();
    let mut round = Round {
        wall_ms: 0.0,
        tokens: 0,
        gen_ms: 0.0,
        latencies: Vec::new(),
        replies: Vec::new(),
    };
    for (job, start) in turns {
        let t = Instant::now();
        let run = ran(kv::run_in_context(
            engine,
            &mut ctxs.work,
            job,
            start,
            &never,
        ))?;
        round.latencies.push(t.elapsed().as_secs_f64() * 1000.0);
        round.tokens += run.r_tokens;
        round.gen_ms += run.stats.generate_ms as f64;
        round.replies.push(run.reply);
    }
    round.wall_ms = started.elapsed().as_secs_f64() * 1000.0;
    Ok(round)
}

fn together(engine: &Engine, ctxs: &mut Contexts, turns: Vec<(TurnJob, Start)>) -> Result<Round> {
    let started = Instant::now();
    let batch = turns
        .into_iter()
        .map(|(job, start)| BatchTurn::new(job, start))
        .collect();
    let runs = kv::run_batch(engine, ctxs, batch)
        .into_iter()
        .map(ran)
        .collect::<Result<Vec<_>>>()?;
    let wall_ms = started.elapsed().as_secs_f64() * 1000.0;
    let first = runs.iter().map(|r| r.stats.ttft_ms).min().unwrap_or(0);
    let last = runs
        .iter()
        .map(|r| r.stats.ttft_ms + r.stats.generate_ms)
        .max()
        .unwrap_or(0);
    // A batched turn is done when step 5 (done one session after another) reaches it; the
    // engine reports no such instant, so each one's latency is counted as the whole batch.
    Ok(Round {
        wall_ms,
        tokens: runs.iter().map(|r| r.r_tokens).sum(),
        gen_ms: (last - first) as f64,
        latencies: vec![wall_ms; runs.len()],
        replies: runs.into_iter().map(|r| r.reply).collect(),
    })
}

pub fn batching(model: &Path, quick: bool) -> Result<Value> {
    let sizes: &[usize] = if quick { &[1, 2, 4] } else { &[1, 2, 4, 8] };
    let rounds = if quick { 1 } else { 3 };
    let reply_max = if quick { 24 } else { 64 };
    let history_sizes: &[usize] = if quick { &[3] } else { &[0, 8] };
    let max = *sizes.iter().max().unwrap_or(&1);
    let kv_type = std::env::var("KVMEM_BENCH_KV_TYPE").unwrap_or_else(|_| "q8_0".into());
    let settings = Settings::defaults()
        .with(json!({ "n_ctx": 2048, "kv_tail_tokens": 2000, "kv_type": kv_type }))?;
    let engine = kvmem::system::load_engine(model, None, EngineParams::from_settings(&settings))?;
    let mut ctxs = Contexts {
        work: engine.new_context()?,
        batch: Some(engine.new_batch_context(max as u32)?),
    };

    let ceiling = prefill_rate(&engine, &mut ctxs, rounds)?;
    println!(
        "Ceiling: a prefill of {PREFILL} tokens in one decode (every token through every weight, \
         the most a batch of rows can share) runs at {} tokens/s.\n",
        crate::spread(&ceiling)
    );
    let mut tables = Vec::new();
    for &history_turns in history_sizes {
        tables.push(measure(
            &engine,
            &mut ctxs,
            sizes,
            rounds,
            reply_max,
            history_turns,
            &kv_type,
        )?);
    }
    Ok(
        json!({"suite": "batch", "model": model, "kv_type": kv_type, "reply_max": reply_max,
              "rounds": rounds, "prefill_tokens_per_s": ceiling, "tables": tables}),
    )
}

/// One table: each session's KV holds `history_turns` earlier exchanges.
fn measure(
    engine: &Engine,
    ctxs: &mut Contexts,
    sizes: &[usize],
    rounds: usize,
    reply_max: u32,
    history_turns: usize,
    kv_type: &str,
) -> Result<Value> {
    let max = *sizes.iter().max().unwrap_or(&1);
    // Each session's KV after a cold rebuild of its history: every measured turn resumes
    // warm from the same snapshot.
    let mut snaps = Vec::new();
    for i in 0..max {
        let history = (0..history_turns)
            .map(|k| Exchange {
                turn_id: k as i64 + 1,
                user: format!("Tell me more about {}, part {k}.", TOPICS[(i + k) % 8]),
                reply: format!(
                    "{} remembers {}: on day {k} the crew argued, the weather turned and the \
                     supplies ran short, so they changed course twice before nightfall.",
                    PEOPLE[i].0,
                    TOPICS[(i + k) % 8]
                ),
            })
            .collect();
        let never = AtomicBool::new(false);
        let first = job(i, 1, "Where are we?".into(), 8);
        let run = ran(kv::run_in_context(
            engine,
            &mut ctxs.work,
            first,
            Start::Cold(ColdSource::Text(history)),
            &never,
        ))?;
        snaps.push(snapshot_of(&run, 1)?);
    }
    let history_tokens = snaps.iter().map(|s| s.token_ids.len()).sum::<usize>() / max;
    let turns = |n: usize| -> Vec<(TurnJob, Start)> {
        (0..n)
            .map(|i| {
                let message = format!(
                    "Describe {} in detail, and what you will do about it.",
                    TOPICS[i]
                );
                (
                    job(i, 2, message, reply_max),
                    Start::Snapshot(Box::new(snaps[i].clone())),
                )
            })
            .collect()
    };

    println!(
        "## batch: sessions decoded together vs one at a time (SmolLM2, {kv_type} KV, ~{history_tokens} tokens of KV, \
         ≤{reply_max} reply tokens, {rounds} round(s), one process)\n"
    );
    println!("| sessions | one at a time: gen tok/s | together: gen tok/s | gen ratio | whole turns: tok/s alone | together | ratio | turn latency alone ms | in batch ms | replies identical |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    for &n in sizes {
        let (mut gen_ratio, mut turn_ratio) = (Vec::new(), Vec::new());
        let (mut gen_a, mut gen_b, mut tps_a, mut tps_b) = (vec![], vec![], vec![], vec![]);
        let (mut lat_a, mut lat_b) = (vec![], vec![]);
        let mut identical = 0;
        let mut compared = 0;
        for round in 0..rounds {
            // Side by side, alternating which goes first.
            let (a, b) = if round % 2 == 0 {
                let a = alone(engine, ctxs, turns(n))?;
                (a, together(engine, ctxs, turns(n))?)
            } else {
                let b = together(engine, ctxs, turns(n))?;
                (alone(engine, ctxs, turns(n))?, b)
            };
            let per_s = |tokens: u32, ms: f64| tokens as f64 / (ms / 1000.0);
            gen_a.push(per_s(a.tokens, a.gen_ms));
            gen_b.push(per_s(b.tokens, b.gen_ms));
            tps_a.push(per_s(a.tokens, a.wall_ms));
            tps_b.push(per_s(b.tokens, b.wall_ms));
            gen_ratio.push(gen_b.last().unwrap() / gen_a.last().unwrap());
            turn_ratio.push(tps_b.last().unwrap() / tps_a.last().unwrap());
            lat_a.push(median(&mut a.latencies.clone()));
            lat_b.push(median(&mut b.latencies.clone()));
            compared += n;
            identical += a
                .replies
                .iter()
                .zip(&b.replies)
                .filter(|(x, y)| x == y)
                .count();
        }
        let r = |v: &[f64]| {
            let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            format!("{:.2}× [{lo:.2}–{hi:.2}]", median(&mut v.to_vec()))
        };
        println!(
            "| {n} | {} | {} | {} | {} | {} | {} | {} | {} | {identical}/{compared} |",
            spread(&gen_a),
            spread(&gen_b),
            r(&gen_ratio),
            spread(&tps_a),
            spread(&tps_b),
            r(&turn_ratio),
            spread(&lat_a),
            spread(&lat_b),
        );
        rows.push(json!({
            "sessions": n, "gen_tokens_per_s_alone": gen_a, "gen_tokens_per_s_together": gen_b,
            "gen_ratio": gen_ratio, "turn_tokens_per_s_alone": tps_a, "turn_tokens_per_s_together": tps_b,
            "turn_ratio": turn_ratio, "turn_latency_ms_alone": lat_a, "turn_latency_ms_together": lat_b,
            "replies_identical": identical, "replies_compared": compared,
        }));
        // The worker refuses to batch with f16 KV; measured here for its speed only.
        anyhow::ensure!(
            identical == compared || kv_type != "q8_0",
            "{n} sessions: {} of {compared} replies differ between alone and batched",
            compared - identical
        );
    }
    println!();
    Ok(json!({"history_tokens": history_tokens, "rows": rows}))
}

const PREFILL: usize = 512;

/// Tokens/s of one large prefill: the rate a batch's shared steps approach as rows grow,
/// since each row of a step costs what a prefilled token costs.
fn prefill_rate(engine: &Engine, ctxs: &mut Contexts, rounds: usize) -> Result<Vec<f64>> {
    let text = TOPICS.join(", and ").repeat(16);
    let mut tokens = engine.tokenize_plain(&text);
    tokens.truncate(PREFILL);
    anyhow::ensure!(tokens.len() == PREFILL, "filler too short");
    let mut rates = Vec::new();
    for _ in 0..rounds {
        let mut s = kvmem::engine::KvSession::empty(engine, &mut ctxs.work);
        let t = Instant::now();
        s.append(&tokens, None)?;
        rates.push(PREFILL as f64 / t.elapsed().as_secs_f64());
    }
    Ok(rates)
}
