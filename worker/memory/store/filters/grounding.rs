//! Grounding: whether a fact (or its evidence) says only what the message it came from
//! says, by the content-word rules the parent module's docs set out.

use std::collections::HashSet;

/// Share of a fact's content tokens that must appear in the source.
pub const MIN_TOKEN_OVERLAP: f32 = 0.45;
/// Facts with at most this many content tokens need every one of them in the source.
pub const SHORT_LINE_TOKENS: usize = 3;

/// Words that carry no content, including the pronouns and "user" that rewriting a
/// first-person message into a third-person fact adds.
#[rustfmt::skip]
const STOP_WORDS: &[&str] = &[
    "a", "an", "the", "and", "or", "but", "if", "of", "to", "in", "on", "at", "by", "for",
    "with", "from", "as", "into", "about", "than", "then", "so", "that", "this", "these",
    "those", "there", "here", "it", "its", "is", "are", "was", "were", "be", "been", "being",
    "am", "has", "have", "had", "do", "does", "did", "will", "would", "can", "could", "should",
    "shall", "may", "might", "must", "no", "very", "really", "just", "also", "too", "some",
    "any", "all", "each", "every", "both", "much", "many", "more", "most", "other", "such",
    "own", "same", "what", "which", "who", "whom", "whose", "when", "where", "why", "how", "i",
    "im", "ive", "ill", "id", "me", "my", "mine", "myself", "we", "our", "ours", "us", "you",
    "your", "yours", "he", "him", "his", "she", "her", "hers", "they", "them", "their",
    "theirs", "user", "users", "person", "someone", "speaker", "currently", "now",
];

/// Lowercase content tokens: apostrophes removed first ("don't" is one token), split on
/// anything not alphanumeric, stop-words and single letters out.
fn content_tokens(s: &str) -> Vec<String> {
    let folded = s.replace(['\'', '’', '‘'], "").to_lowercase();
    folded
        .split(|c: char| !c.is_alphanumeric())
        .filter(|t| !t.is_empty())
        .filter(|t| t.chars().count() > 1 || t.chars().all(|c| c.is_ascii_digit()))
        .map(fold_negation)
        .filter(|t| !STOP_WORDS.contains(t))
        .map(str::to_string)
        .collect()
}

/// Negations are content ("does not eat meat" must not ground in "eats meat"), and all
/// their spellings count as one token.
fn fold_negation(t: &str) -> &str {
    match t {
        "not" | "never" | "dont" | "doesnt" | "didnt" | "isnt" | "arent" | "wasnt" | "werent"
        | "cant" | "cannot" | "wont" | "wouldnt" | "hasnt" | "havent" | "hadnt" => "not",
        _ => t,
    }
}

/// Names and numbers in a fact: words capitalised after the first, or holding a digit.
fn named_tokens(s: &str) -> Vec<String> {
    let folded = s.replace(['\'', '’', '‘'], "");
    folded
        .split(|c: char| !c.is_alphanumeric())
        .filter(|t| !t.is_empty())
        .enumerate()
        .filter(|(i, t)| {
            t.chars().any(|c| c.is_ascii_digit())
                || (*i > 0 && t.chars().next().is_some_and(char::is_uppercase))
        })
        .map(|(_, t)| t.to_lowercase())
        .filter(|t| !STOP_WORDS.contains(&t.as_str()))
        .collect()
}

/// Inflection-tolerant match: equal, or one a prefix of the other (at least 3 characters)
/// differing by at most 3 ("live"/"lives", "nurse"/"nurses", "work"/"working").
fn token_matches(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    let (short, long) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    short.len() >= 3 && long.len() - short.len() <= 3 && long.starts_with(short)
}

pub(super) fn compact(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_alphanumeric())
        .flat_map(char::to_lowercase)
        .collect()
}

/// Seed 002's grounding test (see the module docs for the exact rules).
pub fn is_text_grounded_in_source(text: &str, source: &str) -> bool {
    let fact_tokens = content_tokens(text);
    if fact_tokens.is_empty() {
        return false;
    }
    let source_tokens: HashSet<String> = content_tokens(source).into_iter().collect();
    let present = |t: &String| source_tokens.iter().any(|s| token_matches(t, s));
    let source_all: HashSet<String> = compact_words(source);
    let named_ok = named_tokens(text)
        .iter()
        .all(|t| source_all.iter().any(|s| token_matches(t, s)));
    if !named_ok {
        return false;
    }
    let c = compact(text);
    if compact(source).contains(&c) {
        return true;
    }
    let mut unique: Vec<&String> = Vec::new();
    for t in &fact_tokens {
        if !unique.contains(&t) {
            unique.push(t);
        }
    }
    let hits = unique.iter().filter(|t| present(t)).count();
    if unique.len() <= SHORT_LINE_TOKENS {
        return hits == unique.len();
    }
    hits as f32 / unique.len() as f32 >= MIN_TOKEN_OVERLAP
}

/// The fact's content words (negation folded to "not") that the source does not hold,
/// inflection-tolerant: the strict grounding, where seed 002 asks only 45 %.
pub fn ungrounded_words(text: &str, source: &str) -> Vec<String> {
    let source_tokens: Vec<String> = content_tokens(source);
    let mut out: Vec<String> = Vec::new();
    for t in content_tokens(text) {
        if !source_tokens.iter().any(|s| token_matches(&t, s)) && !out.contains(&t) {
            out.push(t);
        }
    }
    out
}

/// Whether the text holds a negation ("not", "never", "don't", … folded as grounding does).
pub fn has_negation(text: &str) -> bool {
    content_tokens(text).iter().any(|t| t == "not")
        || compact_words(text)
            .iter()
            .any(|w| matches!(w.as_str(), "no" | "nobody" | "nothing" | "anymore"))
}

/// Every word of the source, stop-words included (names may collide with stop-words).
fn compact_words(s: &str) -> HashSet<String> {
    s.replace(['\'', '’', '‘'], "")
        .to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .collect()
}
