//! The dialogue's candidates: the lexical, vector, span, voice and time-window legs,
//! scored by the request's ranker.

use std::collections::{HashMap, HashSet};

use pgvector::Vector;

use super::super::error::Result;
use super::super::ranker::RankerKind;
use super::super::service::MemoryService;
use super::lexical::bm25_ids;
use super::rank::{self, Signals};
use super::rows::{channel_score, fetch_messages, MsgRow};
use super::spans::nearest_spans;
use super::timeq::TimeWindow;
use super::types::{
    ranks, Hit, HitKind, SearchRequest, LEXICAL_CANDIDATES, VECTOR_CANDIDATES, WINDOW_CANDIDATES,
};
use super::vector::{cosines, nearest_messages};
use super::words::{content_words, names, overlap, substance, VAGUE};

/// What one leg found: its candidates, best first, and a value per candidate where the leg
/// measures one. The legs are registered in one list, in [`message_candidates`]; each
/// names the signal it feeds.
struct Leg {
    /// For the one leg measured after the fetch (the voice), to find it again.
    name: &'static str,
    order: Vec<i64>,
    values: HashMap<i64, f64>,
    /// Writes the leg's signal for one candidate: its rank in `order` and its value.
    feeds: fn(&mut Signals, Option<usize>, Option<f64>),
}

impl Leg {
    fn new(
        name: &'static str,
        order: Vec<i64>,
        feeds: fn(&mut Signals, Option<usize>, Option<f64>),
    ) -> Leg {
        Leg {
            name,
            order,
            values: HashMap::new(),
            feeds,
        }
    }

    fn valued(mut self, values: HashMap<i64, f64>) -> Leg {
        self.values = values;
        self
    }
}

/// The registered legs with each one's rank lookup, for the fusion.
struct Legs(Vec<(Leg, HashMap<i64, usize>)>);

impl Legs {
    fn new(legs: Vec<Leg>) -> Legs {
        Legs(
            legs.into_iter()
                .map(|l| {
                    let r = ranks(&l.order);
                    (l, r)
                })
                .collect(),
        )
    }

    fn feed(&self, id: i64, s: &mut Signals) {
        for (leg, rank) in &self.0 {
            (leg.feeds)(s, rank.get(&id).copied(), leg.values.get(&id).copied());
        }
    }
}

/// The registered leg of that name.
fn named<'a>(legs: &'a mut [Leg], name: &str) -> &'a mut Leg {
    let found = legs.iter_mut().find(|l| l.name == name);
    found.unwrap_or_else(|| panic!("no search leg named {name} is registered"))
}

/// Every leg's candidates in order of first appearance, leg by leg, each once.
fn union(legs: &[Leg]) -> Vec<i64> {
    let mut seen: HashSet<i64> = HashSet::new();
    legs.iter()
        .flat_map(|l| l.order.iter().copied())
        .filter(|id| seen.insert(*id))
        .collect()
}

/// What the search made of the question before the dialogue's legs run.
pub(super) struct Asked<'a> {
    pub(super) window: Option<&'a TimeWindow>,
    /// The question's content words.
    pub(super) words: &'a [String],
    pub(super) vector: Option<&'a [f32]>,
    /// The speaker the question names, and the question in their voice.
    pub(super) voice: Option<(&'a str, &'a [f32])>,
    /// Whether the user's history is small enough to compare every vector.
    pub(super) exact: bool,
}

/// The dialogue's candidates, each with what the ranker reads.
pub(super) async fn message_candidates(
    svc: &MemoryService,
    req: &SearchRequest,
    asked: &Asked<'_>,
) -> Result<Vec<(Hit, Signals)>> {
    let pool = &svc.pool;
    let scope = &req.scope;
    let (window, qwords, qvec, voice) = (asked.window, asked.words, asked.vector, asked.voice);
    let qv = qvec.map(|q| Vector::from(q.to_vec()));
    let vv = voice.map(|(_, v)| Vector::from(v.to_vec()));
    let Dense {
        vector,
        spans,
        voiced,
    } = dense_legs(svc, req, qv.as_ref(), vv.as_ref(), asked.exact).await?;
    let vector_ids: Vec<i64> = vector.iter().map(|x| x.0).collect();
    let lexical = bm25_ids(
        pool,
        scope,
        req.as_of,
        &req.query,
        LEXICAL_CANDIDATES,
        &vector_ids,
    )
    .await?;
    let mut cos: HashMap<i64, f64> = vector.iter().copied().collect();
    let window_list = match window {
        Some(w) => window_leg(svc, req, w, qwords, qv.as_ref(), &mut cos).await?,
        None => Vec::new(),
    };
    let lex_order: Vec<i64> = lexical.iter().map(|x| x.0).collect();
    let mut span_members: Vec<i64> = spans.keys().copied().collect();
    span_members.sort_unstable();
    // The fetched rows carry the query's cosine; these candidates take theirs from them.
    let cosine_from_rows: HashSet<i64> = lex_order.iter().chain(&span_members).copied().collect();
    // The registration point: one entry per leg, in the union's order.
    let mut legs = vec![
        Leg::new("lexical", lex_order, |s, rank, bm25| {
            s.lexical_rank = rank;
            s.bm25 = bm25.unwrap_or(0.0);
        })
        .valued(shares(&lexical)),
        Leg::new(
            "vector",
            vector.iter().take(VECTOR_CANDIDATES).map(|x| x.0).collect(),
            |s, rank, _| s.vector_rank = rank,
        ),
        Leg::new("window", window_list, |s, rank, _| s.window_rank = rank),
        Leg::new("spans", span_members, |s, _, cos| s.span = cos).valued(spans),
        // Measured after the fetch (below): only the named speaker's rows are in the voice.
        Leg::new(
            "voice",
            voiced.iter().map(|x| x.0).collect(),
            |s, _, cos| s.voice = cos,
        ),
    ];
    let ids = union(&legs);
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let model = svc.model_id();
    // A search only reads: a candidate without a vector keeps its lexical signals, and the
    // memory lane gives it one (seed 002's backfill, moved off the request path).
    let rows = fetch_messages(pool, &scope.user_id, &ids, qv.as_ref(), model).await?;
    take_cosines(&rows, &cosine_from_rows, &mut cos);
    if let (Some((speaker, _)), Some(v)) = (voice, &vv) {
        let who = (scope.user_id.as_str(), speaker);
        let voice_cos = voice_cosines(svc, who, v, voiced, &rows).await?;
        named(&mut legs, "voice").values = voice_cos;
    }
    let legs = Legs::new(legs);
    let semantic = qvec.is_some().then_some(&cos);
    Ok(signals(req, window, qwords, semantic, &legs, rows)
        .into_iter()
        .filter(|(row, _)| req.skip_speaker.as_deref() != Some(row.speaker.as_str()))
        .map(|(row, s)| (to_hit(row), s))
        .collect())
}

/// The rows come back with the query's cosine, saving a round trip: the `wanted` candidates
/// the vector list did not reach take theirs from it.
fn take_cosines(rows: &[MsgRow], wanted: &HashSet<i64>, cos: &mut HashMap<i64, f64>) {
    for r in rows {
        if let (Some(c), true) = (r.cosine, wanted.contains(&r.id)) {
            cos.entry(r.id).or_insert(c);
        }
    }
}

fn to_hit(row: MsgRow) -> Hit {
    Hit {
        kind: HitKind::Message,
        id: row.message_id.clone(),
        text: row.text,
        score: 0.0,
        components: Default::default(),
        source_message_ids: vec![row.message_id],
        session_id: Some(row.session_id),
        speaker: Some(row.speaker),
        at: Some(row.at),
        entity_refs: Vec::new(),
    }
}

/// Each BM25 score as a share of the list's best.
fn shares(lexical: &[(i64, f64)]) -> HashMap<i64, f64> {
    let best = lexical.iter().map(|x| x.1).fold(0.0, f64::max);
    lexical
        .iter()
        .map(|&(id, s)| (id, if best > 0.0 { s / best } else { 0.0 }))
        .collect()
}

/// What the vector legs found: the nearest messages, the turns inside the nearest spans,
/// and the named speaker's nearest messages to the question in their voice.
struct Dense {
    vector: Vec<(i64, f64)>,
    spans: HashMap<i64, f64>,
    voiced: Vec<(i64, f64)>,
}

async fn dense_legs(
    svc: &MemoryService,
    req: &SearchRequest,
    qv: Option<&Vector>,
    vv: Option<&Vector>,
    exact: bool,
) -> Result<Dense> {
    let Some(q) = qv else {
        return Ok(Dense {
            vector: Vec::new(),
            spans: HashMap::new(),
            voiced: Vec::new(),
        });
    };
    // The legs are independent statements on connections of their own: run together, a
    // small history's exact scans share the cores instead of waiting on each other.
    let voiced = async {
        match vv {
            Some(v) => nearest_messages(svc, req, v, exact).await,
            None => Ok(Vec::new()),
        }
    };
    // Only the hybrid ranker reads spans; the others score the message vectors alone.
    let spans = async {
        match req.ranker {
            RankerKind::Hybrid => nearest_spans(svc, req, q, exact).await,
            _ => Ok(HashMap::new()),
        }
    };
    let (vector, spans, voiced) =
        tokio::try_join!(nearest_messages(svc, req, q, exact), spans, voiced)?;
    Ok(Dense {
        vector,
        spans,
        voiced,
    })
}

/// The voiced question's cosine with each of the named speaker's candidate turns (their
/// turns only: the other speaker's words are not in that voice).
async fn voice_cosines(
    svc: &MemoryService,
    (user, speaker): (&str, &str),
    v: &Vector,
    voiced: Vec<(i64, f64)>,
    rows: &[MsgRow],
) -> Result<HashMap<i64, f64>> {
    let theirs: Vec<i64> = rows
        .iter()
        .filter(|r| r.speaker == speaker)
        .map(|r| r.id)
        .collect();
    let mut cos: HashMap<i64, f64> = voiced.into_iter().collect();
    fill_cosines(svc, user, &theirs, Some(v), &mut cos).await?;
    cos.retain(|id, _| theirs.contains(id));
    Ok(cos)
}

/// The query's cosine for those of `ids` the vector list did not bring.
async fn fill_cosines(
    svc: &MemoryService,
    user: &str,
    ids: &[i64],
    qv: Option<&Vector>,
    cos: &mut HashMap<i64, f64>,
) -> Result<()> {
    let Some(q) = qv else {
        return Ok(());
    };
    let need: Vec<i64> = ids
        .iter()
        .filter(|id| !cos.contains_key(id))
        .copied()
        .collect();
    cos.extend(cosines(&svc.pool, user, &need, q, svc.model_id()).await?);
    Ok(())
}

/// Time-window list: the messages inside the window, ranked by what the query asks beyond
/// its time phrase. "What did I do in May?" asks nothing beyond it: then the substantive
/// statements of the window come first (content words, not questions).
async fn window_leg(
    svc: &MemoryService,
    req: &SearchRequest,
    w: &TimeWindow,
    qwords: &[String],
    qv: Option<&Vector>,
    cos: &mut HashMap<i64, f64>,
) -> Result<Vec<i64>> {
    let (pool, scope) = (&svc.pool, &req.scope);
    let in_win: Vec<i64> =
        sqlx::query_scalar(include_str!("../../../sql/memory/window_messages.sql"))
            .persistent(false)
            .bind(&scope.user_id)
            .bind(scope.character_id)
            .bind(&scope.guild_id)
            .bind(req.as_of)
            .bind(w.start)
            .bind(w.end)
            .fetch_all(pool)
            .await?;
    fill_cosines(svc, &scope.user_id, &in_win, qv, cos).await?;
    let phrase: Vec<String> = content_words(&w.phrase);
    let rest: Vec<String> = qwords
        .iter()
        .filter(|x| {
            !phrase.contains(x) && !VAGUE.contains(&x.as_str()) && x.parse::<i32>().is_err()
        })
        .cloned()
        .collect();
    let rows = fetch_messages(pool, &scope.user_id, &in_win, None, None).await?;
    let mut scored: Vec<(i64, f64)> = rows
        .iter()
        .map(|r| {
            let score = if rest.is_empty() {
                substance(&r.text)
            } else {
                0.5 * overlap(&rest, "", &r.text)
                    + 0.5 * cos.get(&r.id).copied().unwrap_or(0.0).max(0.0)
            };
            (r.id, score)
        })
        .collect();
    scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    Ok(scored
        .into_iter()
        .take(WINDOW_CANDIDATES)
        .map(|x| x.0)
        .collect())
}

/// Each candidate's signals, for the request's ranker.
fn signals(
    req: &SearchRequest,
    window: Option<&TimeWindow>,
    qwords: &[String],
    semantic: Option<&HashMap<i64, f64>>,
    legs: &Legs,
    rows: Vec<MsgRow>,
) -> Vec<(MsgRow, Signals)> {
    let scope = &req.scope;
    let mut cands: Vec<(MsgRow, Signals)> = rows
        .into_iter()
        .map(|row| {
            let text = format!("{} {}", row.speaker, row.text);
            let mut s = Signals {
                lexical: overlap(qwords, &req.query, &text),
                semantic: semantic.and_then(|c| c.get(&row.id).copied()),
                // A message is what was said, not an inferred fact: full confidence.
                confidence: 1.0,
                at: Some(row.at),
                channel: channel_score(scope.channel_id.as_deref(), row.channel_id.as_deref()),
                in_window: window.map(|w| w.contains(row.at)),
                ..Signals::default()
            };
            legs.feed(row.id, &mut s);
            (row, s)
        })
        .collect();
    // Seed 001's entity frequency over the candidate set.
    let ents: Vec<Vec<String>> = cands.iter().map(|(r, _)| names(&r.text)).collect();
    for ((_, s), f) in cands.iter_mut().zip(rank::entity_frequency(&ents)) {
        s.entity_freq = f;
    }
    cands
}
