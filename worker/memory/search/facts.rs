//! The extracted facts as hits: each scored by the request's ranker against the query. A
//! fact without a vector of the query's model is scored lexically (the memory lane fills
//! it; a search only reads).

use super::super::embed;
use super::super::error::Result;
use super::super::service::MemoryService;
use super::super::store;
use super::rank::{self, Signals};
use super::rows::channel_score;
use super::types::{ranks, Hit, HitKind, SearchRequest, FACT_CANDIDATES, VECTOR_CANDIDATES};
use super::words::overlap;

/// The extracted facts' candidates, each with what the ranker reads.
pub(super) async fn fact_candidates(
    svc: &MemoryService,
    req: &SearchRequest,
    qwords: &[String],
    qvec: Option<&[f32]>,
) -> Result<Vec<(Hit, Signals)>> {
    let facts = store::facts(&svc.pool, &req.scope, req.as_of, FACT_CANDIDATES).await?;
    if facts.is_empty() {
        return Ok(Vec::new());
    }
    let lex: Vec<f64> = facts
        .iter()
        .map(|f| overlap(qwords, &req.query, &lexical_text(f)))
        .collect();
    let sem: Vec<Option<f64>> = facts
        .iter()
        .map(|f| match (qvec, f.vector_of(svc.model_id())) {
            (Some(q), Some(b)) => Some(embed::dot_bytes(q, b) as f64),
            _ => None,
        })
        .collect();
    let (lr, vr) = list_ranks(&lex, &sem);
    let freq = rank::entity_frequency(
        &facts
            .iter()
            .map(|f| f.entity_refs.clone())
            .collect::<Vec<_>>(),
    );
    let mut out = Vec::new();
    for (i, f) in facts.into_iter().enumerate() {
        if !lr.contains_key(&i) && !vr.contains_key(&i) {
            continue;
        }
        let s = Signals {
            lexical_rank: lr.get(&i).copied(),
            lexical: lex[i],
            semantic: if qvec.is_some() { sem[i] } else { None },
            vector_rank: vr.get(&i).copied(),
            confidence: f.confidence as f64,
            at: Some(f.valid_from),
            channel: channel_score(req.scope.channel_id.as_deref(), f.channel_id.as_deref()),
            entity_freq: freq[i],
            in_window: None,
            window_rank: None,
            // A fact is a statement complete in itself: it stands as its own span, and
            // its share of the query's words stands for BM25's share.
            span: if qvec.is_some() { sem[i] } else { None },
            bm25: lex[i],
            voice: None,
        };
        out.push((fact_hit(f), s));
    }
    Ok(out)
}

/// What a fact's words are matched in: its entity, its text and its evidence.
fn lexical_text(f: &store::Memory) -> String {
    format!(
        "{} {} {}",
        f.entity_label.as_deref().unwrap_or(""),
        f.text,
        f.evidence_text.as_deref().unwrap_or("")
    )
}

/// Each fact's rank in the lexical list (those sharing a query word, best first) and in
/// the vector list (the nearest [`VECTOR_CANDIDATES`]), by its index.
fn list_ranks(lex: &[f64], sem: &[Option<f64>]) -> (Ranks, Ranks) {
    let mut lex_order: Vec<usize> = (0..lex.len()).filter(|&i| lex[i] > 0.0).collect();
    lex_order.sort_by(|&a, &b| lex[b].total_cmp(&lex[a]).then(a.cmp(&b)));
    let mut vec_order: Vec<usize> = (0..sem.len()).filter(|&i| sem[i].is_some()).collect();
    vec_order.sort_by(|&a, &b| {
        sem[b]
            .unwrap_or(0.0)
            .total_cmp(&sem[a].unwrap_or(0.0))
            .then(a.cmp(&b))
    });
    vec_order.truncate(VECTOR_CANDIDATES);
    (ranks(&lex_order), ranks(&vec_order))
}

type Ranks = std::collections::HashMap<usize, usize>;

/// A fact as a hit, before the ranker scores it.
fn fact_hit(f: store::Memory) -> Hit {
    Hit {
        kind: HitKind::Memory,
        id: format!("memory:{}", f.id),
        text: f.text,
        score: 0.0,
        components: Default::default(),
        source_message_ids: f.source_message_ids,
        session_id: None,
        speaker: None,
        at: Some(f.valid_from),
        entity_refs: f.entity_refs,
    }
}
