//! Fact extraction on llama.cpp: a small local model lists what a message tells about
//! people, one line per fact ([`lines`]), a GBNF grammar guarantees the list parses, and
//! seed 002's filters plus the subject, strict-grounding and negation rules decide what may
//! be stored. Messages with nothing to remember skip the model ([`skip`]). Also seed 004's
//! memory-blob merge. Generation itself is the engine's ([`crate::engine::generate`]).
//!
//! Decoding is greedy with a mild repetition penalty: deterministic, and small models stop
//! looping. Calls are synchronous; run them on the thread that owns the context.

mod candidate;
pub mod lines;
pub mod skip;
mod subject;
mod words;

use std::sync::Arc;

pub use candidate::{slug, Extraction, FactCandidate, MAX_FACTS};
pub use lines::{postprocess, LINES_GRAMMAR, LINES_SYSTEM};
pub use skip::skip_reason;

use crate::engine::generate::{
    generate_warm, give_way, Ask, Busy, GenerateError, WarmContext, BACKGROUND_PREFILL_CHUNK,
};
use crate::engine::Engine;
use crate::memory::store::filters::{clean_text, is_text_grounded_in_source};

/// Token budget for one extraction: four lines of up to 120 characters fit, and a list
/// cut off by it keeps its complete lines.
pub const EXTRACT_MAX_TOKENS: u32 = 160;
/// Longest merged memory blob kept, in characters (seed 004's "bounded growth").
pub const MAX_BLOB_CHARS: usize = 1200;

/// Seed 001's memory kinds: the store's own type.
pub use crate::memory::store::Kind as MemoryKind;

const MERGE_SYSTEM: &str = "You keep a short memory about a person, written in the third person. \
You are given the current memory and one new fact. Rewrite the memory so that it includes the new \
fact. When the new fact contradicts the memory, the new fact wins and the old statement is removed. \
Keep every other statement. Answer with the updated memory only: plain sentences, no list, no \
commentary.";

/// Extraction with one loaded model; the model can differ from the chat model (seed 002's
/// memoryLlm) because it is just another [`Engine`].
pub struct Extractor {
    engine: Arc<Engine>,
    /// Token budget per message; see [`EXTRACT_MAX_TOKENS`].
    pub max_tokens: u32,
    /// Skip the model when the message's own clauses already give a kept fact: faster,
    /// and the facts the model alone finds in such a message are lost (ops/bench-extract
    /// measures both with `KVMEM_EXTRACT_RULES_FIRST=1`).
    pub rules_first: bool,
    /// Live turns need the cores: every decode step waits while this says so.
    busy: Option<Busy>,
}

impl Extractor {
    pub fn new(engine: Arc<Engine>) -> Extractor {
        Extractor {
            engine,
            max_tokens: EXTRACT_MAX_TOKENS,
            rules_first: false,
            busy: None,
        }
    }

    /// This extractor, pausing before every decode step while `busy` is true (a worker's
    /// memory lane: an extraction already running gives way to a turn within one step).
    pub fn yielding(mut self, busy: Option<Busy>) -> Extractor {
        self.busy = busy;
        self
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// A context for this extractor's calls; it keeps the instruction's KV between them.
    pub fn new_context(&self) -> Result<WarmContext, crate::engine::EngineError> {
        self.engine.new_context().map(WarmContext::new)
    }

    /// Durable, grounded facts from one message, at most [`MAX_FACTS`]; none, without a
    /// model call, for a message the skip rule turns away. `ctx` must come from
    /// [`Extractor::new_context`].
    pub fn extract(
        &self,
        ctx: &mut WarmContext,
        speaker: &str,
        text: &str,
    ) -> Result<Extraction, GenerateError> {
        if let Some(ex) = skipped(text) {
            return Ok(ex);
        }
        let rule_lines = lines::clause_lines(speaker, text);
        if self.rules_first {
            let mut ex = postprocess(&rule_lines.join("\n"), speaker, text, false);
            if !ex.facts.is_empty() {
                // No model answer: the bench counts these as calls saved.
                ex.raw.clear();
                ex.rule_lines = rule_lines;
                return Ok(ex);
            }
        }
        let user = format!("{speaker}: {}", clean_text(text));
        let ask = Ask {
            system: LINES_SYSTEM,
            user: &user,
            grammar: Some(LINES_GRAMMAR),
            max_tokens: self.max_tokens,
        };
        let (raw, truncated) = self.generate(ctx, &ask)?;
        let mut all = rule_lines.clone();
        all.extend(raw.lines().map(str::to_string));
        let mut ex = postprocess(&all.join("\n"), speaker, text, truncated);
        ex.raw = raw;
        ex.rule_lines = rule_lines;
        Ok(ex)
    }

    /// Several messages in one model call: each meets the skip rule alone, the others go
    /// to the model as one transcript (the instruction's KV stays warm, and one answer's
    /// frame serves them all), and each of the model's lines belongs to the first message
    /// whose filters keep it. One outcome per message, in order; a line no message keeps
    /// is counted against the first message the model saw.
    pub fn extract_batch(
        &self,
        ctx: &mut WarmContext,
        messages: &[(&str, &str)],
    ) -> Result<Vec<Extraction>, GenerateError> {
        let mut out: Vec<Extraction> = messages
            .iter()
            .map(|(_, text)| skipped(text).unwrap_or_default())
            .collect();
        let live: Vec<usize> = (0..messages.len())
            .filter(|&i| out[i].skipped.is_none())
            .collect();
        if let [only] = live[..] {
            let (speaker, text) = messages[only];
            out[only] = self.extract(ctx, speaker, text)?;
        }
        if live.len() < 2 {
            return Ok(out);
        }
        let user: Vec<String> = live
            .iter()
            .map(|&i| format!("{}: {}", messages[i].0, clean_text(messages[i].1)))
            .collect();
        let ask = Ask {
            system: LINES_SYSTEM,
            user: &user.join("\n"),
            grammar: Some(BATCH_GRAMMAR),
            max_tokens: self.max_tokens * live.len().min(2) as u32,
        };
        let (raw, truncated) = self.generate(ctx, &ask)?;
        let mut theirs: Vec<Vec<String>> = vec![Vec::new(); messages.len()];
        let mut stray = Extraction::default();
        for line in raw.lines() {
            let owner = live.iter().copied().find(|&i| {
                let (speaker, text) = messages[i];
                !postprocess(line, speaker, text, false).facts.is_empty()
            });
            match owner {
                Some(i) => theirs[i].push(line.to_string()),
                None => {
                    let (speaker, text) = messages[live[0]];
                    stray
                        .rejected
                        .add(&postprocess(line, speaker, text, false).rejected);
                }
            }
        }
        for (n, &i) in live.iter().enumerate() {
            let (speaker, text) = messages[i];
            let rule_lines = lines::clause_lines(speaker, text);
            let all: Vec<String> = rule_lines.iter().chain(&theirs[i]).cloned().collect();
            let mut ex = postprocess(&all.join("\n"), speaker, text, truncated);
            if n == 0 {
                ex.rejected.add(&stray.rejected);
            }
            ex.raw = raw.clone();
            ex.rule_lines = rule_lines;
            out[i] = ex;
        }
        Ok(out)
    }

    /// Seed 004's remember: merges `fact` into the third-person `blob` about `subject`
    /// (temperature 0, newer information wins), at most [`MAX_BLOB_CHARS`]. If the model
    /// loses the new fact, it is appended: a remembered fact is never silently dropped.
    pub fn merge_blob(
        &self,
        ctx: &mut WarmContext,
        subject: &str,
        blob: &str,
        fact: &str,
    ) -> Result<String, GenerateError> {
        let fact = clean_text(fact);
        let blob = clean_text(blob);
        let user = format!(
            "Person: {subject}\nCurrent memory: {}\nNew fact: {fact}\nUpdated memory:",
            if blob.is_empty() { "(empty)" } else { &blob }
        );
        let out = self.answer(ctx, MERGE_SYSTEM, &user, None, (MAX_BLOB_CHARS / 3) as u32)?;
        Ok(finish_blob(&out, &fact))
    }

    /// Seed 004's "remember this about X": one third-person sentence about `name` from
    /// what the user said about them. Greedy, one line; the caller grounds it.
    pub fn summarize_about(
        &self,
        ctx: &mut WarmContext,
        name: &str,
        said: &str,
    ) -> Result<String, GenerateError> {
        let user = format!(
            "Person: {name}\nWhat the user said: {}\nFact:",
            clean_text(said)
        );
        let out = self.answer(ctx, ABOUT_SYSTEM, &user, Some(ABOUT_GRAMMAR), 96)?;
        Ok(clean_text(&out))
    }

    fn answer(
        &self,
        ctx: &mut WarmContext,
        system: &str,
        user: &str,
        grammar: Option<&str>,
        max_tokens: u32,
    ) -> Result<String, GenerateError> {
        let ask = Ask {
            system,
            user,
            grammar,
            max_tokens,
        };
        self.generate(ctx, &ask).map(|(s, _)| s)
    }

    /// Every call decodes in the background lane's steps, yielding or not, so the lane
    /// and `ops/bench-extract` give the same greedy answers.
    fn generate(
        &self,
        ctx: &mut WarmContext,
        ask: &Ask<'_>,
    ) -> Result<(String, bool), GenerateError> {
        let mut wait = || give_way(self.busy.as_ref());
        generate_warm(&self.engine, ctx, ask, BACKGROUND_PREFILL_CHUNK, &mut wait)
    }
}

/// The outcome for a message the skip rule turns away, counted.
fn skipped(text: &str) -> Option<Extraction> {
    let why = skip_reason(text)?;
    let mut ex = Extraction {
        skipped: Some(why),
        ..Extraction::default()
    };
    ex.rejected.skipped = 1;
    Some(ex)
}

/// [`LINES_GRAMMAR`] with room for the facts of a few messages.
const BATCH_GRAMMAR: &str = r#"
root ::= line{1,8}
line ::= "- " [A-Z] [^\n]{4,118} "\n"
"#;

const ABOUT_SYSTEM: &str = "You write one short fact about a person, in the third person, using \
the person's name and only words from what the user said. Answer with the fact only.";

/// One sentence, no line breaks or quotes.
const ABOUT_GRAMMAR: &str = r#"
root ::= [A-Z] [^\n"]{8,300} "."
"#;

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
