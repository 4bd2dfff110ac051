//! Fact extraction on llama.cpp: a small local model is asked for durable facts about the
//! user, a GBNF grammar makes its answer well-formed JSON whatever the model's quality, and
//! seed 002's filters (`super::filters`) decide what may be stored. Also the generic
//! constrained-generation helper and seed 004's memory-blob merge, which reuse it.
//!
//! Decoding is greedy with a mild repetition penalty: deterministic, and small models stop
//! looping. Calls are synchronous; run them on the thread that owns the context.

use std::sync::Arc;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use llama_cpp_2::token::LlamaToken;
use serde::Deserialize;

use super::filters::{
    check_fact, clean_text, dedup_key, is_text_grounded_in_source, screen, FactType, Reason,
    RejectCounts, Verdict,
};
use crate::engine::Engine;

/// Seed 002: at most 4 facts per message.
pub const MAX_FACTS: usize = 4;
/// Token budget for one extraction. The grammar bounds each fact, and an answer cut off
/// by this budget is closed after its last complete fact (see [`close_truncated_array`]).
pub const EXTRACT_MAX_TOKENS: u32 = 400;
/// Longest merged memory blob kept, in characters (seed 004's "bounded growth").
pub const MAX_BLOB_CHARS: usize = 1200;

const PENALTY_LAST_N: i32 = 64;
const PENALTY_REPEAT: f32 = 1.1;
const SEQ: i32 = 0;

#[derive(Debug, thiserror::Error)]
pub enum ExtractError {
    #[error("llama.cpp refused the grammar: {0}")]
    Grammar(String),
    #[error("prompt of {prompt} tokens plus {max_tokens} to generate does not fit the context of {n_ctx}")]
    TooLong {
        prompt: usize,
        max_tokens: u32,
        n_ctx: u32,
    },
    #[error("decode failed: {0}")]
    Decode(String),
}

/// Seed 001's memory kinds: the store's own type.
pub use super::store::Kind as MemoryKind;

/// A fact that passed the filters, with seed 001's entity fields.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FactCandidate {
    pub text: String,
    pub fact_type: FactType,
    pub kind: MemoryKind,
    /// `person`, `place`, `org` or `project`.
    pub entity_type: Option<String>,
    pub entity_label: Option<String>,
    /// `<type>:<slug>` keys, seed 001's slug rules.
    pub entity_refs: Vec<String>,
    /// 0..=3.
    pub importance: i16,
    /// 0.0..=1.0.
    pub confidence: f32,
    pub evidence: Option<String>,
}

/// The outcome for one message.
#[derive(Debug, Clone, Default)]
pub struct Extraction {
    pub facts: Vec<FactCandidate>,
    pub rejected: RejectCounts,
    /// Entity labels or refs removed because the message does not mention them.
    pub entities_dropped: u32,
    /// The model's raw answer, for logs and the benchmark.
    pub raw: String,
    /// The answer hit the token budget and was closed after its last complete fact.
    pub truncated: bool,
}

/// Seed 001's slug: lowercase, punctuation removed, spaces and hyphens become `_`.
pub fn slug(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars().flat_map(char::to_lowercase) {
        if c.is_alphanumeric() {
            out.push(c);
        } else if (c.is_whitespace() || c == '-' || c == '_') && !out.ends_with('_') {
            out.push('_');
        }
    }
    out.trim_matches('_').to_string()
}

const ENTITY_TYPES: [&str; 4] = ["person", "place", "org", "project"];

/// The extraction answer: an array of at most 4 facts, every field present, in a fixed
/// order, enums as alternatives and every string bounded, so the worst case fits the
/// token budget on most outputs and a cut-off answer can be closed mechanically.
pub const FACTS_GRAMMAR: &str = r#"
root    ::= "[" ( facts )? "]"
facts   ::= fact ( ", " fact ){0,3}
fact    ::= "{\"text\": " text ", \"fact_type\": " ftype ", \"kind\": " kind ", \"entity_type\": " etype ", \"entity_label\": " label ", \"entity_refs\": " refs ", \"importance\": " [0-3] ", \"confidence\": " conf ", \"evidence\": " evid "}"
ftype   ::= "\"preference\"" | "\"profile\"" | "\"relationship\"" | "\"project\"" | "\"other\""
kind    ::= "\"profile\"" | "\"people\"" | "\"project\""
etype   ::= "null" | "\"person\"" | "\"place\"" | "\"org\"" | "\"project\""
label   ::= "null" | "\"" char{1,40} "\""
refs    ::= "[" ( ref ( ", " ref ){0,2} )? "]"
ref     ::= "\"" ( "person" | "place" | "org" | "project" ) ":" [a-z0-9_]{1,30} "\""
conf    ::= "0." [0-9] | "1.0"
text    ::= "\"" char{3,120} "\""
evid    ::= "null" | "\"" char{1,120} "\""
char    ::= [^"\\\x00-\x1f] | "\\" ["\\/]
"#;

/// [`FACTS_GRAMMAR`] with at least one fact. SmolLM2-135M picks `]` whenever the grammar
/// allows it, even for "My sister Priya lives in Lisbon"; made to write a fact, it writes
/// a sensible one. Whether a message holds a fact is then the filters' call.
pub fn facts_grammar_nonempty() -> String {
    FACTS_GRAMMAR.replace(
        "root    ::= \"[\" ( facts )? \"]\"",
        "root    ::= \"[\" facts \"]\"",
    )
}

const EXTRACT_SYSTEM: &str = "List durable facts about the speaker from their message as JSON. Each \
fact is one short third-person sentence using the speaker's name, with words copied from the \
message. At most 4 facts.\n\
Example: \"Dana: I moved to Oslo and I teach chemistry.\" gives [{\"text\": \"Dana lives in Oslo.\", \
\"fact_type\": \"profile\", \"kind\": \"profile\", \"entity_type\": \"place\", \"entity_label\": \"Oslo\", \
\"entity_refs\": [\"place:oslo\"], \"importance\": 2, \"confidence\": 0.9, \"evidence\": \"I moved to Oslo\"}]";

const MERGE_SYSTEM: &str = "You keep a short memory about a person, written in the third person. \
You are given the current memory and one new fact. Rewrite the memory so that it includes the new \
fact. When the new fact contradicts the memory, the new fact wins and the old statement is removed. \
Keep every other statement. Answer with the updated memory only: plain sentences, no list, no \
commentary.";

/// Generation with the model's chat frame: `system` as the system message, `user` as the
/// user message, then the assistant's answer, greedy with a repetition penalty, optionally
/// constrained by a GBNF grammar (root rule `root`). At most `max_tokens` are generated;
/// the context's KV is cleared first and left holding this exchange.
pub fn generate(
    engine: &Engine,
    ctx: &mut LlamaContext<'_>,
    system: &str,
    user: &str,
    grammar: Option<&str>,
    max_tokens: u32,
) -> Result<(String, bool), ExtractError> {
    let whole_batch = engine.params.n_batch as usize;
    generate_yielding(
        engine,
        ctx,
        system,
        user,
        grammar,
        max_tokens,
        whole_batch,
        &mut || {},
    )
}

/// [`generate`], calling `before_decode` before every decode step: a background lane
/// blocks there while a live turn needs the cores, so a job already running gives way
/// within one step instead of slowing the turn down to its end. The prompt is decoded
/// `prefill_chunk` tokens per step: a step cannot be interrupted, so a smaller chunk is a
/// shorter wait for the turn (at some cost in prefill speed; a different chunk size also
/// changes llama.cpp's arithmetic slightly, and so a greedy answer).
#[allow(clippy::too_many_arguments)]
pub fn generate_yielding(
    engine: &Engine,
    ctx: &mut LlamaContext<'_>,
    system: &str,
    user: &str,
    grammar: Option<&str>,
    max_tokens: u32,
    prefill_chunk: usize,
    before_decode: &mut dyn FnMut(),
) -> Result<(String, bool), ExtractError> {
    let mut prompt = engine.base_tokens(system);
    prompt.extend(engine.block(&engine.frame.user, &[user]));
    let n_ctx = ctx.n_ctx();
    if prompt.len() + max_tokens as usize > n_ctx as usize {
        return Err(ExtractError::TooLong {
            prompt: prompt.len(),
            max_tokens,
            n_ctx,
        });
    }
    let model = engine.model();
    let mut grammar = grammar
        .map(|g| LlamaSampler::grammar(model, g, "root"))
        .transpose()
        .map_err(|e| ExtractError::Grammar(e.to_string()))?;
    let mut pick = LlamaSampler::chain_simple([
        LlamaSampler::penalties(model.n_vocab(), PENALTY_LAST_N, PENALTY_REPEAT, 0.0, 0.0),
        LlamaSampler::greedy(),
    ]);

    ctx.clear_kv_cache();
    let decode_err = |e: &dyn std::fmt::Display| ExtractError::Decode(e.to_string());
    let n_batch = prefill_chunk.clamp(1, (engine.params.n_batch as usize).max(1));
    let mut batch = LlamaBatch::new(n_batch, 1);
    for (c, chunk) in prompt.chunks(n_batch).enumerate() {
        batch.clear();
        let last_chunk = (c + 1) * n_batch >= prompt.len();
        for (i, &t) in chunk.iter().enumerate() {
            let logits = last_chunk && i + 1 == chunk.len();
            batch
                .add(t, (c * n_batch + i) as i32, &[SEQ], logits)
                .map_err(|e| decode_err(&e))?;
        }
        before_decode();
        ctx.decode(&mut batch).map_err(|e| decode_err(&e))?;
    }
    let mut out = Vec::new();
    let mut logits_idx = batch.n_tokens() - 1;
    let mut finished = false;
    while (out.len() as u32) < max_tokens {
        let t = next_token(model, ctx, logits_idx, &mut pick, grammar.as_mut())?;
        if model.vocab().is_eog(t) {
            finished = true;
            break;
        }
        out.push(t);
        batch.clear();
        batch
            .add(t, (prompt.len() + out.len() - 1) as i32, &[SEQ], true)
            .map_err(|e| decode_err(&e))?;
        before_decode();
        ctx.decode(&mut batch).map_err(|e| decode_err(&e))?;
        logits_idx = 0;
    }
    Ok((engine.detokenize(&out), !finished))
}

/// Greedy pick under the penalty, checked against the grammar. Running the grammar over
/// the whole 49k vocabulary can cost more than a decode step of a small model, so the
/// unconstrained pick is checked alone first, and the full constrained pass runs only
/// when the grammar rejects it (llama.cpp's common sampler does the same). Both samplers
/// accept the chosen token here; nothing else may accept it again.
fn next_token(
    model: &LlamaModel,
    ctx: &LlamaContext<'_>,
    idx: i32,
    pick: &mut LlamaSampler,
    grammar: Option<&mut LlamaSampler>,
) -> Result<LlamaToken, ExtractError> {
    let no_pick = || ExtractError::Decode("the sampler selected no token".into());
    let mut cur = ctx.token_data_array_ith(idx);
    pick.apply(&mut cur);
    let mut t = cur.selected_token().ok_or_else(no_pick)?;
    if let Some(g) = grammar {
        let mut single = LlamaTokenDataArray::new(vec![LlamaTokenData::new(t, 0.0, 0.0)], false);
        g.apply(&mut single);
        if single.data[0].logit() == f32::NEG_INFINITY {
            let mut cur = ctx.token_data_array_ith(idx);
            g.apply(&mut cur);
            pick.apply(&mut cur);
            t = cur.selected_token().ok_or_else(no_pick)?;
        }
        if !model.vocab().is_eog(t) {
            g.accept(t);
        }
    }
    pick.accept(t);
    Ok(t)
}

/// [`generate`] under a grammar; returns the answer text, cut off if the budget ran out.
pub fn generate_json(
    engine: &Engine,
    ctx: &mut LlamaContext<'_>,
    system: &str,
    user: &str,
    grammar: &str,
    max_tokens: u32,
) -> Result<String, ExtractError> {
    generate(engine, ctx, system, user, Some(grammar), max_tokens).map(|(s, _)| s)
}

/// Closes a JSON array cut off by the token budget after its last complete element:
/// `[{..}, {..}, {"te` becomes `[{..}, {..}]`, and `[{"te` becomes `[]`. `None` when the
/// text does not start an array. A complete array is returned as is, without what follows.
pub fn close_truncated_array(s: &str) -> Option<String> {
    let t = s.trim_start();
    if !t.starts_with('[') {
        return None;
    }
    let (mut depth, mut in_str, mut esc) = (0i32, false, false);
    let mut last_elem_end = None;
    for (i, c) in t.char_indices() {
        if in_str {
            match (esc, c) {
                (true, _) => esc = false,
                (false, '\\') => esc = true,
                (false, '"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '[' | '{' => depth += 1,
            ']' | '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(t[..=i].to_string());
                }
                if depth == 1 {
                    last_elem_end = Some(i);
                }
            }
            _ => {}
        }
    }
    Some(match last_elem_end {
        Some(i) => format!("{}]", &t[..=i]),
        None => "[]".to_string(),
    })
}

#[derive(Debug, Deserialize)]
struct RawFact {
    text: String,
    #[serde(default)]
    fact_type: String,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    entity_type: Option<String>,
    #[serde(default)]
    entity_label: Option<String>,
    #[serde(default)]
    entity_refs: Vec<String>,
    #[serde(default)]
    importance: Option<f64>,
    #[serde(default)]
    confidence: Option<f64>,
    #[serde(default)]
    evidence: Option<String>,
}

/// Turns a model answer into filtered facts: parse (closing a cut-off array), run every
/// candidate through the filters with `"<speaker>: <text>"` as the grounding source, drop
/// ungrounded entity labels and refs, dedup, cap at [`MAX_FACTS`]. Pure, so it is tested
/// on hand-written answers.
pub fn postprocess(raw: &str, speaker: &str, text: &str, truncated: bool) -> Extraction {
    let mut ex = Extraction {
        raw: raw.to_string(),
        truncated,
        ..Extraction::default()
    };
    let parsed: Vec<RawFact> = match close_truncated_array(raw)
        .and_then(|json| serde_json::from_str::<Vec<RawFact>>(&json).ok())
    {
        Some(p) => p,
        None => {
            ex.rejected.malformed += 1;
            return ex;
        }
    };
    let source = format!("{speaker}: {text}");
    let mut seen = Vec::new();
    for f in parsed {
        let clean = match check_fact(&f.text, &f.fact_type, f.evidence.as_deref(), &source) {
            Verdict::Accepted(c) => c,
            Verdict::Rejected(r) => {
                ex.rejected.record(&r);
                continue;
            }
        };
        let key = dedup_key(&clean.text);
        if seen.contains(&key) {
            ex.rejected.record(&Reason::Duplicate);
            continue;
        }
        if ex.facts.len() >= MAX_FACTS {
            ex.rejected.record(&Reason::OverCap);
            continue;
        }
        seen.push(key);
        if clean.evidence_dropped {
            ex.rejected.evidence_dropped += 1;
        }
        let (entity_type, entity_label, entity_refs, dropped) = entities(&f, &source);
        ex.entities_dropped += dropped;
        let kind = kind_for(clean.fact_type, f.kind.as_deref(), entity_type.as_deref());
        ex.facts.push(FactCandidate {
            text: clean.text,
            fact_type: clean.fact_type,
            kind,
            entity_type,
            entity_label,
            entity_refs,
            importance: f.importance.unwrap_or(1.0).round().clamp(0.0, 3.0) as i16,
            confidence: f
                .confidence
                .filter(|c| c.is_finite())
                .unwrap_or(0.5)
                .clamp(0.0, 1.0) as f32,
            evidence: clean.evidence,
        });
    }
    ex
}

/// The model's kind, corrected where the fact type or entity says otherwise: small models
/// label kinds at random, and a relationship filed under PROJECT never reaches its card.
fn kind_for(fact_type: FactType, kind: Option<&str>, entity_type: Option<&str>) -> MemoryKind {
    match (fact_type, entity_type) {
        (FactType::Relationship, _) | (_, Some("person")) => return MemoryKind::People,
        (FactType::Project, _) | (_, Some("project")) => return MemoryKind::Project,
        _ => {}
    }
    match kind.map(|k| k.trim().to_ascii_lowercase()).as_deref() {
        Some("people") => MemoryKind::People,
        Some("project") => MemoryKind::Project,
        _ => MemoryKind::Profile,
    }
}

type Entities = (Option<String>, Option<String>, Vec<String>, u32);

/// Entity fields kept only when the message mentions them, so a hallucinated name never
/// opens an entity card.
fn entities(f: &RawFact, source: &str) -> Entities {
    let mut dropped = 0;
    let etype = f
        .entity_type
        .as_deref()
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| ENTITY_TYPES.contains(&t.as_str()));
    let label = f
        .entity_label
        .as_deref()
        .map(clean_text)
        .filter(|l| !l.is_empty());
    let label = match label {
        Some(l)
            if l.chars().count() <= 60
                && screen(&l).is_none()
                && is_text_grounded_in_source(&l, source)
                && !slug(&l).is_empty() =>
        {
            Some(l)
        }
        Some(_) => {
            dropped += 1;
            None
        }
        None => None,
    };
    let (etype, label) = match (etype, label) {
        (Some(t), Some(l)) => (Some(t), Some(l)),
        (_, None) => (None, None),
        (None, Some(l)) => (None, Some(l)),
    };
    let mut refs: Vec<String> = Vec::new();
    if let (Some(t), Some(l)) = (&etype, &label) {
        refs.push(format!("{t}:{}", slug(l)));
    }
    for r in &f.entity_refs {
        let Some((t, name)) = r.split_once(':') else {
            dropped += 1;
            continue;
        };
        let t = t.trim().to_ascii_lowercase();
        let s = slug(name);
        let grounded = is_text_grounded_in_source(&s.replace('_', " "), source);
        if !ENTITY_TYPES.contains(&t.as_str()) || s.is_empty() || !grounded {
            dropped += 1;
            continue;
        }
        let key = format!("{t}:{s}");
        if !refs.contains(&key) {
            refs.push(key);
        }
    }
    (etype, label, refs, dropped)
}

/// Extraction with one loaded model; the model can differ from the chat model (seed 002's
/// memoryLlm) because it is just another [`Engine`].
pub struct Extractor {
    engine: Arc<Engine>,
    /// Token budget per message; see [`EXTRACT_MAX_TOKENS`].
    pub max_tokens: u32,
    /// Let the model answer `[]` ([`FACTS_GRAMMAR`]). Off by default: small models then
    /// never extract anything (see [`facts_grammar_nonempty`]).
    pub allow_empty: bool,
    nonempty_grammar: String,
}

impl Extractor {
    pub fn new(engine: Arc<Engine>) -> Extractor {
        Extractor {
            engine,
            max_tokens: EXTRACT_MAX_TOKENS,
            allow_empty: false,
            nonempty_grammar: facts_grammar_nonempty(),
        }
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Durable, grounded facts from one message, at most [`MAX_FACTS`]. `ctx` must come from
    /// this extractor's engine (`engine().new_context()`); its KV is overwritten. A model
    /// answer that does not parse is counted in `rejected.malformed`, not an error: seed
    /// 002's ingestion goes on without the message's facts.
    pub fn extract(
        &self,
        ctx: &mut LlamaContext<'_>,
        speaker: &str,
        text: &str,
    ) -> Result<Extraction, ExtractError> {
        let user = format!("{speaker}: {text}");
        let (raw, truncated) = generate(
            &self.engine,
            ctx,
            EXTRACT_SYSTEM,
            &user,
            Some(if self.allow_empty {
                FACTS_GRAMMAR
            } else {
                &self.nonempty_grammar
            }),
            self.max_tokens,
        )?;
        Ok(postprocess(&raw, speaker, text, truncated))
    }

    /// Seed 004's remember: merges `fact` into the third-person `blob` about `subject`
    /// (temperature 0, newer information wins), at most [`MAX_BLOB_CHARS`]. If the model
    /// loses the new fact, it is appended: a remembered fact is never silently dropped.
    pub fn merge_blob(
        &self,
        ctx: &mut LlamaContext<'_>,
        subject: &str,
        blob: &str,
        fact: &str,
    ) -> Result<String, ExtractError> {
        merge_blob(&self.engine, ctx, subject, blob, fact)
    }
}

impl Extractor {
    /// Seed 004's "remember this about X": one third-person sentence about `name` from
    /// what the user said about them. Greedy, one line; the caller grounds it.
    pub fn summarize_about(
        &self,
        ctx: &mut LlamaContext<'_>,
        name: &str,
        said: &str,
    ) -> Result<String, ExtractError> {
        let user = format!(
            "Person: {name}\nWhat the user said: {}\nFact:",
            clean_text(said)
        );
        let (out, _) = generate(
            &self.engine,
            ctx,
            ABOUT_SYSTEM,
            &user,
            Some(ABOUT_GRAMMAR),
            96,
        )?;
        Ok(clean_text(&out))
    }
}

const ABOUT_SYSTEM: &str = "You write one short fact about a person, in the third person, using \
the person's name and only words from what the user said. Answer with the fact only.";

/// One sentence, no line breaks or quotes.
const ABOUT_GRAMMAR: &str = r#"
root ::= [A-Z] [^\n"]{8,300} "."
"#;

/// See [`Extractor::merge_blob`].
pub fn merge_blob(
    engine: &Engine,
    ctx: &mut LlamaContext<'_>,
    subject: &str,
    blob: &str,
    fact: &str,
) -> Result<String, ExtractError> {
    let fact = clean_text(fact);
    let blob = clean_text(blob);
    let user = format!(
        "Person: {subject}\nCurrent memory: {}\nNew fact: {fact}\nUpdated memory:",
        if blob.is_empty() { "(empty)" } else { &blob }
    );
    let budget = (MAX_BLOB_CHARS / 3) as u32;
    let (out, _) = generate(engine, ctx, MERGE_SYSTEM, &user, None, budget)?;
    Ok(finish_blob(&out, &fact))
}

/// Whitespace collapsed, the new fact appended when the model's text does not contain it,
/// then the oldest sentences not carrying the new fact dropped until it fits
/// [`MAX_BLOB_CHARS`] (newer information wins the space too).
pub fn finish_blob(model_text: &str, fact: &str) -> String {
    let mut text = clean_text(model_text);
    if !fact.is_empty() && !is_text_grounded_in_source(fact, &text) {
        if !text.is_empty() && !text.ends_with(['.', '!', '?']) {
            text.push('.');
        }
        text = clean_text(&format!("{text} {fact}"));
    }
    let mut sentences: Vec<String> = split_sentences(&text);
    while sentences
        .iter()
        .map(|s| s.chars().count() + 1)
        .sum::<usize>()
        > MAX_BLOB_CHARS + 1
    {
        let victim = sentences
            .iter()
            .position(|s| !is_text_grounded_in_source(fact, s));
        match victim {
            Some(i) if sentences.len() > 1 => {
                sentences.remove(i);
            }
            _ => break,
        }
    }
    let text = sentences.join(" ");
    if text.chars().count() <= MAX_BLOB_CHARS {
        return text;
    }
    text.chars().take(MAX_BLOB_CHARS).collect()
}

fn split_sentences(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for c in text.chars() {
        cur.push(c);
        if matches!(c, '.' | '!' | '?') {
            out.push(cur.trim().to_string());
            cur.clear();
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out.retain(|s| !s.is_empty());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_follow_seed_001() {
        assert_eq!(slug("John Doe"), "john_doe");
        assert_eq!(slug("Acme Corp."), "acme_corp");
        assert_eq!(slug("Austin, Texas"), "austin_texas");
        assert_eq!(slug("dashboard-redesign"), "dashboard_redesign");
        assert_eq!(slug("  O'Brien -- Jr. "), "obrien_jr");
        assert_eq!(slug("São Paulo"), "são_paulo");
        assert_eq!(slug("!!"), "");
    }

    #[test]
    fn truncated_arrays_close_after_the_last_complete_fact() {
        assert_eq!(close_truncated_array("[]").as_deref(), Some("[]"));
        assert_eq!(
            close_truncated_array(r#"[{"a": "x}"}, {"a": "y"}] trailing"#).as_deref(),
            Some(r#"[{"a": "x}"}, {"a": "y"}]"#)
        );
        assert_eq!(
            close_truncated_array(r#"[{"a": "x", "r": ["p:q"]}, {"a": "y\"}, {"#).as_deref(),
            Some(r#"[{"a": "x", "r": ["p:q"]}]"#)
        );
        assert_eq!(close_truncated_array(r#"[{"a": "#).as_deref(), Some("[]"));
        assert_eq!(close_truncated_array("I think"), None);
    }

    const MSG: &str = "My sister Priya lives in Lisbon and works as a nurse.";

    #[test]
    fn postprocess_keeps_grounded_facts_and_counts_the_rest() {
        let raw = r#"[{"text": "Sam's sister Priya lives in Lisbon.", "fact_type": "relationship", "kind": "project", "entity_type": "person", "entity_label": "Priya", "entity_refs": ["place:lisbon", "person:priya", "place:madrid"], "importance": 2, "confidence": 0.9, "evidence": "My sister Priya lives in Lisbon"},
            {"text": "Sam's sister is a doctor in Madrid.", "fact_type": "relationship", "kind": "people", "entity_type": null, "entity_label": null, "entity_refs": [], "importance": 1, "confidence": 0.5, "evidence": null},
            {"text": "sam's sister priya lives in lisbon", "fact_type": "profile", "kind": "profile", "entity_type": null, "entity_label": null, "entity_refs": [], "importance": 1, "confidence": 0.5, "evidence": null},
            {"text": "Sam's sister works as a nurse.", "fact_type": "general", "kind": "profile", "entity_type": "person", "entity_label": "Maria", "entity_refs": [], "importance": 3, "confidence": 1.0, "evidence": "she hates it"}]"#;
        let ex = postprocess(raw, "Sam", MSG, false);
        assert_eq!(ex.facts.len(), 2);
        let f = &ex.facts[0];
        assert_eq!(f.text, "Sam's sister Priya lives in Lisbon.");
        assert_eq!(f.fact_type, FactType::Relationship);
        assert_eq!(
            f.kind,
            MemoryKind::People,
            "relationship overrides the model's kind"
        );
        assert_eq!(f.entity_type.as_deref(), Some("person"));
        assert_eq!(f.entity_label.as_deref(), Some("Priya"));
        assert_eq!(f.entity_refs, vec!["person:priya", "place:lisbon"]);
        assert_eq!(f.importance, 2);
        assert_eq!(f.confidence, 0.9);
        assert_eq!(
            f.evidence.as_deref(),
            Some("My sister Priya lives in Lisbon")
        );
        let g = &ex.facts[1];
        assert_eq!(g.text, "Sam's sister works as a nurse.");
        assert_eq!(g.fact_type, FactType::Other);
        assert_eq!(g.entity_label, None, "Maria is not in the message");
        assert_eq!(g.entity_type, None);
        assert_eq!(g.evidence, None);
        assert_eq!(ex.rejected.ungrounded, 1);
        assert_eq!(ex.rejected.duplicate, 1);
        assert_eq!(ex.rejected.evidence_dropped, 1);
        assert_eq!(ex.rejected.rejected(), 2);
        assert_eq!(ex.entities_dropped, 2, "place:madrid and the label Maria");
    }

    #[test]
    fn postprocess_caps_at_four_and_counts_malformed() {
        let msg = "I like tea, coffee, cocoa, juice and milk.";
        let one = |d: &str| {
            format!(
                r#"{{"text": "Al likes {d}.", "fact_type": "preference", "kind": "profile", "entity_type": null, "entity_label": null, "entity_refs": [], "importance": 9, "confidence": 7.5, "evidence": null}}"#
            )
        };
        let raw = format!(
            "[{}]",
            ["tea", "coffee", "cocoa", "juice", "milk"]
                .map(one)
                .join(", ")
        );
        let ex = postprocess(&raw, "Al", msg, false);
        assert_eq!(ex.facts.len(), MAX_FACTS);
        assert_eq!(ex.rejected.over_cap, 1);
        assert_eq!(ex.facts[0].importance, 3, "clamped");
        assert_eq!(ex.facts[0].confidence, 1.0, "clamped");
        assert_eq!(ex.facts[3].text, "Al likes juice.");

        let bad = postprocess("{not json", "Al", msg, false);
        assert!(bad.facts.is_empty());
        assert_eq!(bad.rejected.malformed, 1);
        let empty = postprocess("[]", "Al", msg, false);
        assert!(empty.facts.is_empty());
        assert_eq!(empty.rejected, RejectCounts::default());
    }

    #[test]
    fn merged_blob_keeps_the_new_fact_and_its_bound() {
        assert_eq!(
            finish_blob(
                "Sam lives in Porto.\n\nSam   is a nurse.",
                "Sam lives in Porto"
            ),
            "Sam lives in Porto. Sam is a nurse."
        );
        // The model lost the new fact: it is appended.
        assert_eq!(
            finish_blob("Sam is a nurse", "Sam has a dog named Rex."),
            "Sam is a nurse. Sam has a dog named Rex."
        );
        // Over the bound: the oldest sentences go, the new fact stays.
        let old = "Sam once visited a small town by the sea. ".repeat(40);
        let out = finish_blob(&old, "Sam has a dog named Rex.");
        assert!(out.chars().count() <= MAX_BLOB_CHARS);
        assert!(out.ends_with("Sam has a dog named Rex."));
        assert!(out.starts_with("Sam once visited"));
    }
}
