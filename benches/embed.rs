//! Embedding speed of GGUF embedders (one model's quantisations, or several models), side by side in one
//! process: the query's embedding is part of every search, and the import's rate is set
//! by the embedder. Numbers, never assertions. Run through `ops/bench-embed`.
//!
//! `cargo bench --bench embed -- MODEL.gguf [MODEL.gguf ...]`
//! Texts: the tuning half of `ops/memory-evalset` (its questions as queries, its chat
//! lines, each with the line before it as the import keys them, as the batch).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use kvmem::memory::embed::{dot, Embedder, Role};

const BATCH: usize = 64;

fn evalset() -> Result<(Vec<String>, Vec<String>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("ops/memory-evalset");
    let split: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("split.json"))?)?;
    let mut queries = Vec::new();
    let mut keys = Vec::new();
    for name in split["tune"].as_array().context("split.json: tune")? {
        let name = name.as_str().context("split.json: a name")?;
        let conv = dir.join("conversations");
        let qs = std::fs::read_to_string(conv.join(format!("{name}.questions.jsonl")))?;
        for line in qs.lines().filter(|l| !l.trim().is_empty()) {
            let q: serde_json::Value = serde_json::from_str(line)?;
            queries.push(q["question"].as_str().unwrap_or_default().to_string());
        }
        let text = std::fs::read_to_string(conv.join(format!("{name}.txt")))?;
        let mut prev: Option<String> = None;
        for line in text.lines() {
            let Some((who, said)) = line.split_once(": ") else {
                prev = None;
                continue;
            };
            if who.contains(' ') || who == "title" || who == "speakers" || who == "style" {
                continue;
            }
            let own = format!("{who}: {said}");
            keys.push(match &prev {
                Some(p) => format!("{p}\n{own}"),
                None => own.clone(),
            });
            prev = Some(own);
        }
    }
    Ok((queries, keys))
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn main() -> Result<()> {
    let paths: Vec<PathBuf> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .map(PathBuf::from)
        .collect();
    if paths.is_empty() {
        bail!("usage: cargo bench --bench embed -- MODEL.gguf [MODEL.gguf ...]");
    }
    let threads: i32 = std::env::var("KVMEM_BENCH_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(2);
    let keys_max: usize = std::env::var("KVMEM_BENCH_KEYS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(1024);
    let rounds: usize = std::env::var("KVMEM_BENCH_ROUNDS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(3);
    // Each file once per query thread count, so one run sets them side by side.
    let query_threads: Vec<i32> = std::env::var("KVMEM_BENCH_QUERY_THREADS")
        .unwrap_or_else(|_| "1".into())
        .split_whitespace()
        .map(|t| t.parse().context("KVMEM_BENCH_QUERY_THREADS: a number"))
        .collect::<Result<_>>()?;
    llama_cpp_2::send_logs_to_tracing(llama_cpp_2::LogOptions::default());
    let (queries, mut keys) = evalset()?;
    keys.truncate(keys_max);
    println!(
        "{} queries one at a time on {query_threads:?} threads, {} keys in batches of {BATCH}, {threads} batch threads, {rounds} rounds",
        queries.len(),
        keys.len()
    );
    let mut models = Vec::new();
    let mut names = Vec::new();
    for p in &paths {
        for &q in &query_threads {
            models.push(Embedder::load_with_query_threads(p, threads, q)?);
            names.push(match query_threads.len() {
                1 => p.display().to_string(),
                _ => format!("{} (query on {q} threads)", p.display()),
            });
        }
    }
    let paths: Vec<PathBuf> = paths
        .iter()
        .flat_map(|p| std::iter::repeat_n(p.clone(), query_threads.len()))
        .collect();
    let mut first_vectors: Vec<Vec<Vec<f32>>> = vec![Vec::new(); models.len()];
    for round in 0..rounds {
        // Alternate the order each round so neither model always runs on a cooler machine.
        let order: Vec<usize> = if round % 2 == 0 {
            (0..models.len()).collect()
        } else {
            (0..models.len()).rev().collect()
        };
        for &m in &order {
            let e = &models[m];
            let mut times = Vec::with_capacity(queries.len());
            let mut vecs = Vec::with_capacity(queries.len());
            for q in &queries {
                let t = Instant::now();
                let v = e.embed(std::slice::from_ref(q), Role::Query)?;
                times.push(t.elapsed().as_secs_f64() * 1e3);
                vecs.extend(v);
            }
            times.sort_by(f64::total_cmp);
            let t = Instant::now();
            for chunk in keys.chunks(BATCH) {
                e.embed(chunk, Role::Passage)?;
            }
            let secs = t.elapsed().as_secs_f64();
            println!(
                "round {round} {}: query p50 {:.2} ms p95 {:.2} ms | keys {:.1}/s",
                names[m],
                pct(&times, 0.5),
                pct(&times, 0.95),
                keys.len() as f64 / secs.max(1e-9)
            );
            if round == 0 {
                first_vectors[m] = vecs;
            }
        }
    }
    // Vectors of two models are not comparable: only files of one model (the same name up
    // to the first dot, such as its Q4_0 and Q8_0 files) are set side by side.
    let family = |p: &PathBuf| {
        let name = p.file_name().unwrap_or_default().to_string_lossy();
        name.split('.').next().unwrap_or_default().to_string()
    };
    for m in 1..models.len() {
        let Some(base) = (0..m).find(|&b| family(&paths[b]) == family(&paths[m])) else {
            continue;
        };
        let mut cos: Vec<f64> = first_vectors[base]
            .iter()
            .zip(&first_vectors[m])
            .map(|(a, b)| dot(a, b) as f64)
            .collect();
        cos.sort_by(f64::total_cmp);
        println!(
            "query vectors of {} against {}: cosine min {:.4} p50 {:.4}",
            names[m],
            names[base],
            cos[0],
            pct(&cos, 0.5)
        );
    }
    Ok(())
}
