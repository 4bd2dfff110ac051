//! The skip rule: messages with nothing durable in them (greetings, acknowledgements,
//! questions to the character) never reach the model. Most chat messages are such,
//! and each one the model sees costs the lane a second and risks an invented fact.

/// Words that make up small talk on their own.
#[rustfmt::skip]
const SMALL_TALK: &[&str] = &[
    "hi", "hey", "hello", "yo", "sup", "ok", "okay", "k", "kk", "lol", "lmao", "haha", "hahaha",
    "hehe", "yes", "yeah", "yep", "yup", "no", "nope", "nah", "thanks", "thank", "you", "thx",
    "ty", "cool", "nice", "great", "sure", "bye", "night", "good", "morning", "gn", "gm", "omg",
    "wow", "ah", "oh", "hmm", "true", "same", "right", "totally", "agreed", "fine", "see", "ya",
    "later", "awesome", "perfect", "sounds", "np", "welcome", "so", "too", "much", "the", "a",
    "u", "it", "that", "is", "was", "me", "what", "whats", "up", "how", "are", "doing", "lots",
];

/// Words that tell something about the speaker or someone they know ("we're" is left
/// out: without its apostrophe it reads as "were", as in "if you were").
#[rustfmt::skip]
const PERSONAL: &[&str] = &[
    "i", "im", "ive", "ill", "id", "my", "me", "mine", "myself", "we", "weve", "our", "us",
];

/// Why a message is not worth the model's time, or `None` when it may hold a fact.
pub fn skip_reason(text: &str) -> Option<&'static str> {
    let words: Vec<String> = text
        .replace(['\'', '’'], "")
        .to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect();
    if words.len() < 3 {
        return Some("short");
    }
    if words.iter().all(|w| SMALL_TALK.contains(&w.as_str())) {
        return Some("small_talk");
    }
    let sentences: Vec<&str> = text
        .split_inclusive(['.', '!', '?', '\n'])
        .map(str::trim)
        .filter(|s| s.chars().any(char::is_alphanumeric))
        .collect();
    // Chat drops the "I" ("drive trucks for a living"), so a message without a first
    // person may still be about the speaker; one that asks the character something,
    // without one, is not. "I just moved to Berlin, any tips?" is both, and kept.
    let personal = words.iter().any(|w| PERSONAL.contains(&w.as_str()));
    if !personal && !sentences.is_empty() && sentences.iter().all(|s| s.ends_with('?')) {
        return Some("question");
    }
    let opener = words.first().map(String::as_str).unwrap_or("");
    let asks = QUESTION_OPENERS.contains(&opener)
        || (AUXILIARIES.contains(&opener) && words.get(1).is_some_and(|w| w == "you"));
    if asks && !personal && !names_someone(text) {
        return Some("question");
    }
    None
}

const QUESTION_OPENERS: &[&str] = &[
    "what", "whats", "how", "hows", "why", "where", "when", "who",
];
const AUXILIARIES: &[&str] = &[
    "do", "did", "would", "are", "can", "have", "if", "could", "will", "were", "should",
];

/// A capitalised word that does not start a sentence: a name ("went out with Priya").
fn names_someone(text: &str) -> bool {
    let mut sentence_start = true;
    for w in text.split_whitespace() {
        let capital = w.chars().next().is_some_and(char::is_uppercase);
        if capital && !sentence_start && w.len() > 1 {
            return true;
        }
        sentence_start = w.ends_with(['.', '!', '?']);
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_talk_and_questions_skip_and_statements_do_not() {
        for (text, why) in [
            ("lol", Some("short")),
            ("ok thanks", Some("short")),
            ("haha yes same", Some("small_talk")),
            ("what's your favourite book?", Some("question")),
            ("did you sleep well? how was it?", Some("question")),
            ("would you rather be a cat or a dog", Some("question")),
            ("whats the weather like where you are", Some("question")),
            (
                "if you were a pasta shape what would you be lol",
                Some("question"),
            ),
            ("drive trucks for a living, mostly night runs", None),
            ("I just moved to Berlin, any tips?", None),
            ("my sister priya is a nurse", None),
            ("went climbing with Tom yesterday", None),
            ("i dont drink coffee after 3pm anymore", None),
        ] {
            assert_eq!(skip_reason(text), why, "{text:?}");
        }
    }
}
