//! The text rules every leg shares: content words, light stemming, seed 002's overlap
//! score, names, and the key a message is embedded as.

use std::collections::HashSet;

pub(super) const STOPWORDS: &[&str] = &[
    "a",
    "about",
    "after",
    "again",
    "all",
    "am",
    "an",
    "and",
    "any",
    "are",
    "as",
    "at",
    "be",
    "been",
    "before",
    "being",
    "both",
    "but",
    "by",
    "can",
    "could",
    "did",
    "do",
    "does",
    "doing",
    "during",
    "each",
    "ever",
    "for",
    "from",
    "had",
    "has",
    "have",
    "having",
    "he",
    "her",
    "here",
    "hers",
    "him",
    "his",
    "how",
    "i",
    "if",
    "in",
    "into",
    "is",
    "it",
    "its",
    "just",
    "me",
    "my",
    "no",
    "nor",
    "not",
    "of",
    "off",
    "on",
    "once",
    "only",
    "or",
    "other",
    "our",
    "out",
    "over",
    "own",
    "said",
    "same",
    "she",
    "should",
    "so",
    "some",
    "such",
    "than",
    "that",
    "the",
    "their",
    "them",
    "then",
    "there",
    "these",
    "they",
    "this",
    "those",
    "through",
    "to",
    "too",
    "under",
    "until",
    "up",
    "very",
    "was",
    "we",
    "were",
    "what",
    "when",
    "where",
    "which",
    "while",
    "who",
    "whom",
    "why",
    "will",
    "with",
    "would",
    "you",
    "your",
    "yours",
    "ago",
    "last",
    "tell",
    "know",
    "remember",
    "mention",
    "mentioned",
    "s",
    "t",
    "much",
    "many",
    "does",
    "user",
];

/// Words that say nothing about what is asked once the time phrase is gone.
pub(super) const VAGUE: &[&str] = &[
    "do",
    "happen",
    "happened",
    "happening",
    "going",
    "up",
    "get",
    "got",
    "go",
    "went",
    "make",
    "made",
    "anything",
    "something",
    "thing",
    "things",
    "day",
    "time",
    "plan",
    "plans",
];

/// How much a message says: distinct content words, capped; questions count half.
pub(super) fn substance(text: &str) -> f64 {
    let n = content_words(text).len().min(12) as f64 / 12.0;
    if text.trim_end().ends_with('?') {
        n * 0.5
    } else {
        n
    }
}

/// The content words of a text: lowercase alphanumeric runs, stopwords dropped.
pub fn content_words(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for w in text.split(|c: char| !c.is_alphanumeric()) {
        let w = w.to_lowercase();
        if w.is_empty() || STOPWORDS.contains(&w.as_str()) || out.contains(&w) {
            continue;
        }
        out.push(w);
    }
    out
}

/// Light stemming so "hiking" meets "hike" in seed 002's overlap score.
pub fn stem(w: &str) -> &str {
    for suf in ["ing", "ed", "es", "s"] {
        if w.len() > suf.len() + 2 {
            if let Some(s) = w.strip_suffix(suf) {
                return s.trim_end_matches('e');
            }
        }
    }
    if w.len() > 3 {
        w.trim_end_matches('e')
    } else {
        w
    }
}

/// Seed 002's lexical score: the share of the query's content words found in the text
/// (1.0 when the whole query appears as a substring).
pub fn overlap(query_words: &[String], query: &str, text: &str) -> f64 {
    if query_words.is_empty() {
        return 0.0;
    }
    let compact = |s: &str| {
        s.chars()
            .filter(|c| c.is_alphanumeric())
            .flat_map(char::to_lowercase)
            .collect::<String>()
    };
    let q = compact(query);
    if q.len() >= 6 && compact(text).contains(&q) {
        return 1.0;
    }
    let words: HashSet<String> = content_words(text)
        .iter()
        .map(|w| stem(w).to_string())
        .collect();
    let hit = query_words
        .iter()
        .filter(|w| words.contains(stem(w)))
        .count();
    hit as f64 / query_words.len() as f64
}

/// Names in a text (capitalised words not opening a sentence), for
/// seed 001's entity frequency on messages.
pub fn names(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut sentence_start = true;
    for raw in text.split_whitespace() {
        let w: String = raw.chars().filter(|c| c.is_alphanumeric()).collect();
        let cap = w.chars().next().is_some_and(char::is_uppercase) && w.chars().count() >= 3;
        if cap && !sentence_start && !STOPWORDS.contains(&w.to_lowercase().as_str()) {
            let l = w.to_lowercase();
            if !out.contains(&l) {
                out.push(l);
            }
        }
        sentence_start = raw.ends_with(['.', '!', '?', ':']);
    }
    out
}

/// The text a message is embedded as: speaker and text, then the previous message of its
/// session as context (a contextual key), cut so the message itself dominates.
pub fn message_key(speaker: &str, text: &str, context: Option<&str>) -> String {
    match context {
        Some(c) if !c.trim().is_empty() => {
            let c: String = c.chars().take(160).collect();
            format!("{speaker}: {text} (reply to: {c})")
        }
        _ => format!("{speaker}: {text}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_and_names() {
        let q = "where does Ana live";
        let w = content_words(q);
        assert_eq!(
            w,
            vec!["does".to_string(), "ana".into(), "live".into()]
                .into_iter()
                .filter(|x| x != "does")
                .collect::<Vec<_>>()
        );
        assert_eq!(overlap(&w, q, "Ana lives in Porto"), 1.0);
        assert_eq!(overlap(&w, q, "Porto is nice"), 0.0);
        assert_eq!(
            names("I met Ana in Porto. She likes Tea"),
            vec!["ana", "porto", "tea"]
        );
    }
}
