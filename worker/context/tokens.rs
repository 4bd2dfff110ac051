//! Token counting for budgets (HUD, digest). Budgets are counted with the model's own
//! tokenizer; the word-based counter exists only for the echo generator, which has no model.

use crate::engine::Engine;

/// Something that counts tokens the way the model will see them.
pub trait TokenCount: Send + Sync {
    fn count(&self, text: &str) -> usize;
    /// The longest prefix of `text` that fits `max` tokens.
    fn truncate(&self, text: &str, max: usize) -> String;
}

impl TokenCount for Engine {
    fn count(&self, text: &str) -> usize {
        self.count_tokens(text)
    }

    fn truncate(&self, text: &str, max: usize) -> String {
        let tokens = self.tokenize_plain(text);
        if tokens.len() <= max {
            return text.to_string();
        }
        self.detokenize(&tokens[..max])
    }
}

/// Approximate counter for runs without a model (echo generator, queue tests): one token
/// per whitespace-separated word, which undercounts real tokenizers.
pub struct WordCount;

impl TokenCount for WordCount {
    fn count(&self, text: &str) -> usize {
        text.split_whitespace().count()
    }

    fn truncate(&self, text: &str, max: usize) -> String {
        text.split_whitespace()
            .take(max)
            .collect::<Vec<_>>()
            .join(" ")
    }
}
