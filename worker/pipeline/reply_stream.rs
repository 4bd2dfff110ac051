//! The reply as the user sees it while it is generated: each new token's text goes to the
//! turn's stream as soon as it is certain to stay in the stored reply, so the deltas joined
//! are the stored reply byte for byte. Held back until later tokens settle them: the bytes
//! of a character split across tokens, anything that could still grow into one of the
//! request's stop strings, or into the hidden memory-line tail ([`memory_line`]) or come to
//! stand before one, and the few characters the detokenizer's space clean-up can still
//! change.

use std::borrow::Cow;

use llama_cpp_2::token::LlamaToken;
use serde_json::Value;

use super::memory_line::{self, Split};
use crate::engine::{stop_at, unstoppable_len, Engine, TokenSink};
use crate::stream::TurnStream;

/// What the user sees of a reply made of `tokens` (the worker-written start, its first
/// `start` tokens, then the generated ones): the detokenized text, cut before the first
/// stop string the model generated, without its hidden tail; and whether a stop string
/// cut it. The stored reply and the stream's last delta both come from here.
pub fn reply_split(
    engine: &Engine,
    tokens: &[LlamaToken],
    start: usize,
    stop: &[String],
) -> (Split, bool) {
    let text = engine.detokenize(tokens);
    match stop_at(&text, generated_from(engine, tokens, start, stop), stop) {
        Some(at) => (memory_line::split(&text[..at]), true),
        None => (memory_line::split(&text), false),
    }
}

/// Where the generated text starts: stop strings are looked for from there on only.
fn generated_from(engine: &Engine, tokens: &[LlamaToken], start: usize, stop: &[String]) -> usize {
    if stop.is_empty() || start == 0 {
        return 0;
    }
    engine.detokenize(&tokens[..start.min(tokens.len())]).len()
}

/// A turn's reply on its way to the stream; without a stream every call does nothing.
pub struct ReplyStream {
    stream: Option<TurnStream>,
    /// The worker-written start of the reply, then the tokens generated so far.
    tokens: Vec<LlamaToken>,
    prefix_len: usize,
    /// The request's stop strings, looked for from byte `from` (after the worker-written
    /// start) on.
    stop: Vec<String>,
    from: usize,
    /// The text sent so far: always a prefix of the stored reply.
    sent: String,
}

impl ReplyStream {
    pub fn new(
        engine: &Engine,
        stream: Option<TurnStream>,
        prefix: &[LlamaToken],
        stop: &[String],
    ) -> ReplyStream {
        ReplyStream {
            stream,
            tokens: prefix.to_vec(),
            prefix_len: prefix.len(),
            stop: stop.to_vec(),
            from: generated_from(engine, prefix, prefix.len(), stop),
            sent: String::new(),
        }
    }

    /// Opens the attempt with what the turn knew when it started generating, and the part
    /// of the worker-written start that is settled.
    pub fn start(&mut self, engine: &Engine, meta: Value) {
        let Some(stream) = self.stream.as_mut() else {
            return;
        };
        let first = settled(engine, &self.tokens, self.from, &self.stop);
        self.sent.push_str(&first);
        stream.start(meta, first);
    }
}

impl TokenSink for ReplyStream {
    fn token(&mut self, engine: &Engine, t: LlamaToken) {
        let Some(stream) = self.stream.as_mut() else {
            return;
        };
        self.tokens.push(t);
        let now = settled(engine, &self.tokens, self.from, &self.stop);
        // Settled text only grows; the check keeps a surprise from ever sending text
        // that is not the stored reply's (the last delta then says what is missing).
        if now.len() > self.sent.len() && now.starts_with(self.sent.as_str()) {
            let more = now[self.sent.len()..].to_string();
            self.sent.push_str(&more);
            stream.text(more);
        }
    }

    fn finished(&mut self, engine: &Engine, reply: &[LlamaToken]) {
        let Some(stream) = self.stream.as_mut() else {
            return;
        };
        self.tokens.truncate(self.prefix_len);
        self.tokens.extend_from_slice(reply);
        let whole = reply_split(engine, &self.tokens, self.prefix_len, &self.stop)
            .0
            .reply;
        match whole.strip_prefix(self.sent.as_str()) {
            Some(rest) => stream.end(rest.to_string()),
            None => {
                // Never seen: settled() is built so this cannot happen. Should it, the
                // stream ends without its last text, and readers compare with the stored
                // reply (the HTTP relay reports an error instead of a wrong reply).
                tracing::error!(
                    sent = %self.sent,
                    stored = %whole,
                    "streamed text is not a prefix of the reply; the stream ends short"
                );
                stream.end(String::new());
            }
        }
    }
}

/// The text of `tokens` that no later token can change: a stop string (looked for from
/// byte `from` on) can only cut it where it stands, and neither can the hidden tail.
fn settled(engine: &Engine, tokens: &[LlamaToken], from: usize, stop: &[String]) -> String {
    let bytes = engine.detokenize_bytes(tokens);
    let text = complete_chars(&bytes);
    let text = &text[..unstoppable_len(&text, from, stop)];
    text[..settled_len(text)].to_string()
}

/// The characters of `bytes` that are complete: an unfinished UTF-8 sequence at the end
/// waits for its next token. Invalid bytes become U+FFFD as in [`String::from_utf8_lossy`],
/// which is how the stored reply is made, so the result is a prefix of what the whole
/// reply converts to.
fn complete_chars(bytes: &[u8]) -> Cow<'_, str> {
    let n = bytes.len();
    let mut cut = n;
    for k in 1..=n.min(3) {
        let b = bytes[n - k];
        if b < 0x80 {
            break;
        }
        if b >= 0xC0 {
            let need = if b >= 0xF0 {
                4
            } else if b >= 0xE0 {
                3
            } else {
                2
            };
            if need > k {
                cut = n - k;
            }
            break;
        }
    }
    String::from_utf8_lossy(&bytes[..cut])
}

/// How much of the decoded text is settled: [`memory_line::settled_len`], and nothing
/// from an apostrophe among the last three characters on: a detokenizer that cleans
/// spaces (`" 's"`, `" ' "`, `" 're"`) removes the space before it once what follows is
/// known, and whitespace at the end is already held back.
fn settled_len(text: &str) -> usize {
    let n = memory_line::settled_len(text);
    let head = &text[..n];
    let tail_from = head.char_indices().rev().nth(2).map_or(0, |(i, _)| i);
    match head[tail_from..].find('\'') {
        Some(i) => head[..tail_from + i].trim_end().len(),
        None => n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unfinished_character_waits_for_its_last_byte() {
        let euro = "€".as_bytes(); // three bytes
        assert_eq!(complete_chars(b"ab"), "ab");
        assert_eq!(complete_chars(&euro[..1]), "");
        assert_eq!(complete_chars(&[b"a", &euro[..2]].concat()), "a");
        assert_eq!(complete_chars(&[b"a", euro].concat()), "a€");
        let crab = "🦀".as_bytes(); // four bytes
        assert_eq!(complete_chars(&[b"x", &crab[..3]].concat()), "x");
        assert_eq!(complete_chars(&[b"x", crab].concat()), "x🦀");
        // Invalid bytes are replaced as the stored reply replaces them.
        assert_eq!(complete_chars(&[0xff, b'a']), "\u{fffd}a");
    }

    #[test]
    fn every_prefix_of_the_bytes_settles_to_a_prefix_of_the_reply() {
        let reply = "Ça va? Oui, l'été 🦀 arrive. It's \u{1}ok [[remember: x y z]]";
        let bytes = [reply.as_bytes(), &[0xe2, 0x82]].concat();
        let whole = memory_line::split(&String::from_utf8_lossy(&bytes)).reply;
        for end in 0..=bytes.len() {
            let text = complete_chars(&bytes[..end]);
            let n = settled_len(&text);
            assert!(whole.starts_with(&text[..n]), "{end}: {:?}", &text[..n]);
        }
    }

    #[test]
    fn a_spaced_apostrophe_waits_for_what_follows() {
        // llama.cpp's clean-up turns "it 's" into "it's" once the "s" is there.
        assert_eq!(settled_len("it '"), 2);
        assert_eq!(settled_len("it 'r"), 2);
        assert_eq!(settled_len("it 're fine"), "it 're fine".len());
        assert_eq!(settled_len("rock ' "), 4);
    }
}
