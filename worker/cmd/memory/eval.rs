//! `kvmem memory eval`: recall@k of the rankers over a question file, kept apart from the
//! other subcommands because it scores rather than reads or writes memory.

use chrono::{DateTime, Utc};

use super::error::Result;
use crate::memory::search::{self, SearchRequest};
use crate::memory::store::Scope;
use crate::memory::{MemoryError, MemoryService, RankerKind};

#[derive(serde::Deserialize)]
struct EvalQuestion {
    user_id: String,
    question: String,
    evidence: Vec<String>,
    #[serde(default)]
    r#type: Option<String>,
    #[serde(default)]
    as_of: Option<DateTime<Utc>>,
}

/// Share of a question's evidence ids among the first `k` distinct source message ids of
/// the hits (the measure ops/memory-eval and outside judges use).
fn recall(hits: &[search::Hit], evidence: &[String], k: usize) -> f64 {
    if evidence.is_empty() {
        return 1.0;
    }
    let mut got: Vec<&str> = Vec::new();
    for id in hits.iter().flat_map(|h| h.source_message_ids.iter()) {
        if got.len() == k {
            break;
        }
        if !got.contains(&id.as_str()) {
            got.push(id);
        }
    }
    evidence
        .iter()
        .filter(|e| got.contains(&e.as_str()))
        .count() as f64
        / evidence.len() as f64
}

fn request(q: &EvalQuestion, ranker: RankerKind, use_as_of: bool) -> SearchRequest {
    SearchRequest {
        scope: Scope::user(&q.user_id),
        query: q.question.clone(),
        limit: 20,
        as_of: if use_as_of { q.as_of } else { None },
        ranker,
        strict: false,
        skip_speaker: None,
    }
}

fn questions(path: &std::path::Path) -> Result<Vec<EvalQuestion>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| MemoryError::Invalid(format!("cannot read {}: {e}", path.display())))?;
    let mut qs: Vec<EvalQuestion> = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        qs.push(
            serde_json::from_str(line)
                .map_err(|e| MemoryError::Invalid(format!("line {}: {e}", i + 1)))?,
        );
    }
    Ok(qs)
}

/// Writes each question's candidates (every leg's, before any ranking) with their signals,
/// one JSON line per question, for fitting a ranker outside kvmem on the same candidates
/// the search ranks.
pub(super) async fn dump(
    svc: &MemoryService,
    path: &std::path::Path,
    use_as_of: bool,
    out: &std::path::Path,
) -> Result<()> {
    use std::io::Write;
    let qs = questions(path)?;
    let file = std::fs::File::create(out)
        .map_err(|e| MemoryError::Invalid(format!("cannot write {}: {e}", out.display())))?;
    let mut w = std::io::BufWriter::new(file);
    for q in &qs {
        let g = search::gather(svc, &request(q, RankerKind::Hybrid, use_as_of)).await?;
        let candidates: Vec<serde_json::Value> = g
            .candidates
            .iter()
            .map(|(h, s)| {
                serde_json::json!({"id": h.id, "kind": h.kind, "sources": h.source_message_ids,
                    "session_id": h.session_id, "speaker": h.speaker, "at": h.at, "signals": s,
                    "dedupe_key": crate::memory::store::normalise_text(&h.text)})
            })
            .collect();
        let line = serde_json::json!({"user_id": q.user_id, "question": q.question,
            "type": q.r#type, "evidence": q.evidence, "now": g.now, "candidates": candidates});
        writeln!(w, "{line}")
            .map_err(|e| MemoryError::Invalid(format!("cannot write {}: {e}", out.display())))?;
    }
    w.flush()
        .map_err(|e| MemoryError::Invalid(format!("cannot write {}: {e}", out.display())))?;
    Ok(())
}

pub(super) async fn eval(
    svc: &MemoryService,
    path: &std::path::Path,
    rankers: &[RankerKind],
    use_as_of: bool,
) -> Result<()> {
    let qs = questions(path)?;
    let mut types: Vec<String> = qs.iter().filter_map(|q| q.r#type.clone()).collect();
    types.sort();
    types.dedup();
    println!(
        "{:<9} {:>5} {:>6} {:>6}  {}  p50/p95/p99 ms",
        "ranker",
        "n",
        "R@5",
        "R@10",
        types
            .iter()
            .map(|t| format!("{t}@10"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    // One untimed search first: the process's first search opens the pool's connections
    // and fills their catalog caches (planning took 12 ms instead of 1), which a running
    // worker pays once, not per recall.
    if let (Some(q), Some(&ranker)) = (qs.first(), rankers.first()) {
        search::search(svc, &request(q, ranker, use_as_of)).await?;
    }
    for &ranker in rankers {
        let (mut r5, mut r10) = (0.0, 0.0);
        let mut by_type: std::collections::BTreeMap<String, (f64, usize)> = Default::default();
        let mut lat: Vec<f64> = Vec::new();
        for q in &qs {
            let req = request(q, ranker, use_as_of);
            let t = std::time::Instant::now();
            let res = search::search(svc, &req).await?;
            lat.push(t.elapsed().as_secs_f64() * 1000.0);
            r5 += recall(&res.hits, &q.evidence, 5);
            let x = recall(&res.hits, &q.evidence, 10);
            r10 += x;
            if let Some(t) = &q.r#type {
                let e = by_type.entry(t.clone()).or_default();
                e.0 += x;
                e.1 += 1;
            }
        }
        lat.sort_by(f64::total_cmp);
        let pct = |p: f64| {
            lat.get(((lat.len() as f64 - 1.0) * p).round() as usize)
                .copied()
                .unwrap_or(0.0)
        };
        let n = qs.len().max(1) as f64;
        println!(
            "{:<9} {:>5} {:>6.3} {:>6.3}  {}  {:.1}/{:.1}/{:.1}",
            ranker.as_str(),
            qs.len(),
            r5 / n,
            r10 / n,
            types
                .iter()
                .map(|t| {
                    let (s, c) = by_type.get(t).copied().unwrap_or((0.0, 0));
                    format!("{:>w$.3}", s / c.max(1) as f64, w = t.len() + 3)
                })
                .collect::<Vec<_>>()
                .join(" "),
            pct(0.5),
            pct(0.95),
            pct(0.99)
        );
    }
    Ok(())
}
