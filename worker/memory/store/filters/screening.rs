//! The screen for text that must never be stored as a fact: chat-template markup,
//! instructions aimed at the model, and secrets.

use super::normalise::match_form;
use super::reason::Reason;

/// Chat-template and role markup that should never appear in a fact.
const ROLE_TAGS: &[&str] = &[
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|eot_id|>",
    "<|start_header_id|>",
    "<start_of_turn>",
    "<end_of_turn>",
    "[inst]",
    "[/inst]",
    "<<sys>>",
    "<</sys>>",
    "</s>",
    "<system>",
    "</system>",
    "[system]",
    "### system",
    "### instruction",
];

/// Instruction / prompt-injection phrases. `system` and `developer` only as roles.
const INSTRUCTIONS: &[&str] = &[
    "system prompt",
    "system message",
    "system instruction",
    "system:",
    "system override",
    "developer message",
    "developer mode",
    "developer instruction",
    "developer:",
    "assistant:",
    "ignore previous",
    "ignore all previous",
    "ignore the previous",
    "ignore prior",
    "ignore the above",
    "ignore all prior",
    "ignore your instructions",
    "ignore all instructions",
    "ignore any instructions",
    "disregard previous",
    "disregard all",
    "disregard the above",
    "disregard your",
    "forget your instructions",
    "forget all previous",
    "forget everything above",
    "new instructions",
    "your instructions",
    "previous instructions",
    "you must",
    "you should always",
    "you will now",
    "you are now",
    "from now on",
    "act as",
    "pretend to be",
    "roleplay as",
    "always respond",
    "always reply",
    "always answer",
    "never respond",
    "never reply",
    "respond only",
    "reply only",
    "do anything now",
    "jailbreak",
    "prompt injection",
    "reveal your prompt",
    "print your prompt",
];

/// Secret-bearing words; values are matched by shape in [`looks_like_secret`].
const SECRET_WORDS: &[&str] = &[
    "api key",
    "api_key",
    "apikey",
    "api-key",
    "password",
    "passwd",
    "passcode",
    "pin code",
    "secret key",
    "private key",
    "access token",
    "auth token",
    "bearer token",
    "refresh token",
    "seed phrase",
    "recovery phrase",
    "credit card number",
    "card number",
    "social security number",
    "ssn",
    "-----begin",
    "ssh-rsa",
    "ssh-ed25519",
];

fn contains_phrase(hay: &str, needle: &str) -> bool {
    // Word-boundary match so "act as" does not fire inside "contact assistance" and "ssn"
    // not inside "classnotes"; markup needles (non-alphanumeric ends) match anywhere.
    let mut from = 0;
    while let Some(i) = hay[from..].find(needle) {
        let start = from + i;
        let end = start + needle.len();
        let first_alnum = needle.chars().next().is_some_and(char::is_alphanumeric);
        let last_alnum = needle.chars().last().is_some_and(char::is_alphanumeric);
        let before_ok = !first_alnum || !hay[..start].chars().next_back().is_some_and(is_word_char);
        let after_ok = !last_alnum || !hay[end..].chars().next().is_some_and(is_word_char);
        if before_ok && after_ok {
            return true;
        }
        from = start + needle.chars().next().map_or(1, char::len_utf8);
    }
    false
}

fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The instruction / role-tag / secret screen, on already-cleaned text.
pub fn screen(text: &str) -> Option<Reason> {
    let m = match_form(text);
    if let Some(p) = ROLE_TAGS.iter().find(|p| m.contains(**p)) {
        return Some(Reason::RoleTag { pattern: p });
    }
    if m.contains("<|") && m.contains("|>") {
        return Some(Reason::RoleTag { pattern: "<|…|>" });
    }
    if let Some(p) = INSTRUCTIONS.iter().find(|p| contains_phrase(&m, p)) {
        return Some(Reason::Instruction { pattern: p });
    }
    if let Some(p) = SECRET_WORDS.iter().find(|p| contains_phrase(&m, p)) {
        return Some(Reason::Secret { pattern: p });
    }
    if let Some(p) = text.split_whitespace().find_map(looks_like_secret) {
        return Some(Reason::Secret { pattern: p });
    }
    None
}

/// Known key prefixes, or a long random-looking run of letters and digits.
fn looks_like_secret(word: &str) -> Option<&'static str> {
    let w = word.trim_matches(|c: char| !c.is_alphanumeric() && c != '_' && c != '-');
    for (prefix, name) in [
        ("sk-", "sk- key"),
        ("ghp_", "github token"),
        ("gho_", "github token"),
        ("xoxb-", "slack token"),
        ("xoxp-", "slack token"),
        ("AKIA", "aws key"),
        ("AIza", "google key"),
    ] {
        if w.starts_with(prefix) && w.len() >= prefix.len() + 16 {
            return Some(name);
        }
    }
    let token_chars = w
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '+' | '/' | '='));
    let digits = w.chars().filter(char::is_ascii_digit).count();
    let letters = w.chars().filter(char::is_ascii_alphabetic).count();
    if token_chars && w.len() >= 24 && digits >= 4 && letters >= 4 {
        return Some("long token");
    }
    None
}
