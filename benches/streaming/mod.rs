//! The `stream` suite (issue 47), in one process and one run so its ratios are side by side:
//!
//! - **First content byte against the turn's TTFT.** A worker and the HTTP API run in this
//!   process, as `kvmem serve` runs them; a client asks with `"stream": true` and notes when
//!   the first chunk with reply text arrives, from the moment it sends the request. Beside it
//!   stands the turn's own `ttft_ms` from `turn_log` (from claim to the first sampled token),
//!   cold (a new session) and warm (its next turn), and the same turns asked without
//!   `stream`, whose answer comes whole.
//! - **Tokens/s with deltas on and off.** Two pipelines on one model, one publishing deltas
//!   and one not, run warm turns alternately through the queue while a LISTEN on the
//!   sessions' channels reads the deltas; tokens/s is each turn's reply tokens over its
//!   generation time (`turn_log`).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use kvmem::config::Settings;
use kvmem::engine::{Engine, EngineParams};
use serde_json::{json, Value};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::common;
use crate::{median, run_one, spread, tempdir};

const OPENERS: [&str; 6] = [
    "We just landed at the outpost. What do you see?",
    "Tell me about the ship's engines.",
    "Who guards the northern gate?",
    "Describe the market in the old town.",
    "What did the scouts report this morning?",
    "How do we get past the reactor?",
];
const FOLLOW_UP: &str = "And what should we do next?";

/// One streamed request as its client saw it, with the turn's log.
struct Streamed {
    first_content_ms: f64,
    total_ms: f64,
    ttft_ms: f64,
    cold: bool,
}

pub async fn streaming(base_url: &str, model: &Path, quick: bool) -> Result<Value> {
    let rounds = if quick { 2 } else { 8 };
    let (pool, _) = common::fresh_db(base_url, "kvmem_bench_stream", 16).await?;
    let ch = common::character(&pool, "bench").await?;
    let kv_dir = tempdir("stream")?;
    // One llama.cpp thread: on a machine shared with other work, two spinning ggml threads
    // wait on each other (a first try at two threads prefilled 98 tokens in 7 s).
    let settings = Settings::defaults().with(json!({
        "kv_dir": kv_dir, "n_ctx": 2048, "kv_tail_tokens": 1500, "reply_max_tokens": 48,
        "log_level": "warn", "memory_lane": false, "summary_lane": false, "n_threads": 1,
    }))?;
    let engine = Arc::new(kvmem::system::load_engine(
        model,
        None,
        EngineParams::from_settings(&settings),
    )?);
    let first_byte = first_byte(&pool, ch, &settings, &engine, rounds).await?;
    let pairs = if quick { 3 } else { 10 };
    let tokens = tokens_per_second(&pool, ch, &settings, &engine, pairs).await?;
    Ok(json!({"suite": "stream", "model": model, "first_byte": first_byte, "tokens_per_s": tokens}))
}

/// Streamed and whole answers, cold and warm, alternating, `rounds` times each.
async fn first_byte(
    pool: &PgPool,
    ch: i64,
    settings: &Settings,
    engine: &Arc<Engine>,
    rounds: usize,
) -> Result<Value> {
    let shutdown = CancellationToken::new();
    let deps = crate::llama_deps(pool, settings.clone(), engine.clone())?;
    tokio::spawn(kvmem::runner::run(deps, shutdown.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/v1/chat/completions", listener.local_addr()?);
    let state =
        kvmem::system::App::on(pool.clone(), Arc::new(settings.clone())).http(String::new())?;
    tokio::spawn(kvmem::http::serve(listener, state, shutdown.clone()));
    let client = reqwest::Client::new();
    let mut streamed = Vec::new();
    let mut whole: Vec<(bool, f64)> = Vec::new();
    for r in 0..rounds {
        let opener = OPENERS[r % OPENERS.len()];
        for kind in ["stream", "whole"] {
            let sid = format!("{kind}-{r}");
            for msg in [opener, FOLLOW_UP] {
                let body = json!({"session_id": sid, "user": "bench", "character_id": ch,
                                  "stream": kind == "stream",
                                  "messages": [{"role": "user", "content": msg}]});
                if kind == "stream" {
                    streamed.push(stream_once(&client, &url, &body, pool).await?);
                } else {
                    let sent = Instant::now();
                    let reply: Value = client.post(&url).json(&body).send().await?.json().await?;
                    let cold = reply["kvmem"]["cold"].as_bool().context("kvmem.cold")?;
                    whole.push((cold, ms(sent.elapsed())));
                }
            }
        }
    }
    shutdown.cancel();
    let mut out = json!({});
    println!("## First content byte against the turn's TTFT (SmolLM2, reply <= 48 tokens, {rounds} rounds)\n");
    println!("| start | TTFT ms (turn_log) | first content byte ms (client) | gap ms p50 / p95 / max | streamed total ms | whole answer ms |");
    println!("|---|---:|---:|---:|---:|---:|");
    for cold in [true, false] {
        let of = |f: fn(&Streamed) -> f64| -> Vec<f64> {
            streamed.iter().filter(|s| s.cold == cold).map(f).collect()
        };
        let gaps: Vec<f64> = of(|s| s.first_content_ms - s.ttft_ms);
        let total: Vec<f64> = whole.iter().filter(|w| w.0 == cold).map(|w| w.1).collect();
        let label = if cold { "cold" } else { "warm" };
        let g = common::pcts(gaps.clone());
        println!(
            "| {label} | {} | {} | {:.0} / {:.0} / {:.0} | {} | {} |",
            spread(&of(|s| s.ttft_ms)),
            spread(&of(|s| s.first_content_ms)),
            g["p50"].as_f64().unwrap_or(0.0),
            g["p95"].as_f64().unwrap_or(0.0),
            g["max"].as_f64().unwrap_or(0.0),
            spread(&of(|s| s.total_ms)),
            spread(&total),
        );
        out[label] = json!({"ttft_ms": of(|s| s.ttft_ms), "first_content_ms": of(|s| s.first_content_ms),
                            "gap_ms": g, "streamed_total_ms": of(|s| s.total_ms), "whole_ms": total});
    }
    println!();
    Ok(out)
}

/// One streamed request: when its first reply text arrived, and when it ended.
async fn stream_once(
    client: &reqwest::Client,
    url: &str,
    body: &Value,
    pool: &PgPool,
) -> Result<Streamed> {
    let sent = Instant::now();
    let mut response = client.post(url).json(body).send().await?;
    anyhow::ensure!(response.status() == 200, "status {}", response.status());
    let mut seen = String::new();
    let mut first = None;
    let mut turn = None;
    while let Some(bytes) = response.chunk().await? {
        seen.push_str(std::str::from_utf8(&bytes)?);
        for data in seen.split("\n\n").filter_map(|e| e.strip_prefix("data: ")) {
            let Ok(chunk) = serde_json::from_str::<Value>(data) else {
                continue;
            };
            turn = turn.or(chunk["kvmem"]["turn_id"].as_i64());
            let text = chunk["choices"][0]["delta"]["content"].as_str();
            if first.is_none() && text.is_some_and(|t| !t.is_empty()) {
                first = Some(ms(sent.elapsed()));
            }
        }
    }
    let total_ms = ms(sent.elapsed());
    anyhow::ensure!(
        seen.contains("data: [DONE]"),
        "stream ended without [DONE]: {seen}"
    );
    let turn = turn.context("no turn id in the first chunk")?;
    let (ttft, cold): (i32, bool) =
        sqlx::query_as("SELECT ttft_ms, cold FROM turn_log WHERE turn_id = $1")
            .bind(turn)
            .fetch_one(pool)
            .await?;
    Ok(Streamed {
        first_content_ms: first.context("no content chunk")?,
        total_ms,
        ttft_ms: ttft as f64,
        cold,
    })
}

/// Warm turns alternating between a pipeline that publishes deltas and one that does not.
async fn tokens_per_second(
    pool: &PgPool,
    ch: i64,
    settings: &Settings,
    engine: &Arc<Engine>,
    pairs: usize,
) -> Result<Value> {
    let reply_max = 64;
    let with = |on: bool| -> Result<kvmem::runner::Deps> {
        let s = settings.with(json!({"stream_deltas": on, "reply_max_tokens": reply_max}))?;
        crate::llama_deps(pool, s, engine.clone())
    };
    let (on, off) = (with(true)?, with(false)?);
    // A reader on every session's channel, as a backend would have.
    let mut listener = sqlx::postgres::PgListener::connect_with(pool).await?;
    for p in 0..pairs {
        for deltas in ["on", "off"] {
            let channel: String = sqlx::query_scalar("SELECT kvmem_session_channel($1)")
                .bind(format!("tps-{deltas}-{p}"))
                .fetch_one(pool)
                .await?;
            listener.listen(&channel).await?;
        }
    }
    let reading = tokio::spawn(async move {
        let mut heard = 0u64;
        while listener.recv().await.is_ok() {
            heard += 1;
        }
        heard
    });
    let mut rates: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut ratios = Vec::new();
    for p in 0..pairs {
        let opener = OPENERS[p % OPENERS.len()];
        let mut pair = [0.0; 2];
        // Alternate which goes first, so neither always runs on a warmer machine.
        let order = if p % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let (deps, name) = if i == 0 { (&on, "on") } else { (&off, "off") };
            let sid = format!("tps-{name}-{p}");
            run_one(deps, &sid, ch, opener).await?;
            let id = run_one(deps, &sid, ch, FOLLOW_UP).await?;
            let (r, gen_ms): (i32, i32) =
                sqlx::query_as("SELECT r_tokens, generate_ms FROM turn_log WHERE turn_id = $1")
                    .bind(id.0)
                    .fetch_one(pool)
                    .await?;
            pair[i] = r as f64 * 1000.0 / (gen_ms.max(1) as f64);
            rates[i].push(pair[i]);
        }
        ratios.push(pair[0] / pair[1]);
    }
    reading.abort();
    let mut r = ratios.clone();
    let lo = r.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = r.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    println!("## Tokens/s with deltas on and off (warm turns, reply <= {reply_max} tokens, {pairs} alternating pairs)\n");
    println!("| deltas | tokens/s median [min–max] |\n|---|---:|");
    println!(
        "| on | {} |\n| off | {} |",
        spread(&rates[0]),
        spread(&rates[1])
    );
    println!(
        "\non ÷ off per pair: median {:.3} [{lo:.3}–{hi:.3}] (goal ≥ 0.95)\n",
        median(&mut r)
    );
    Ok(json!({"on": rates[0], "off": rates[1], "ratio_per_pair": ratios}))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
