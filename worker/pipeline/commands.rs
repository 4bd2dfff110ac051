//! Seed 004's in-chat memory commands: "remember that …", "forget that …" and "what do you
//! know about …". The rule is deliberately narrow (the phrase opens the message, a question
//! mark ends only the third), because a false positive would store or archive what the
//! user never asked for; and a forget archives only memories that match, never "the
//! nearest one".

use super::recall;
use crate::memory::ingest::jobs;
use crate::memory::MemoryService;
use crate::turn::{ClaimedTurn, MemoryOp};

/// Longest text a remember or forget takes (the memory SQL API's own limit).
const MAX_TEXT_CHARS: usize = 2000;
/// Facts a "what do you know about" answer lists.
const ANSWER_ITEMS: usize = 3;

/// A command found in a user message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Remember(String),
    Forget(String),
    WhatAbout(String),
    /// "Remember this about Florent": a name and no fact; the fact comes from the
    /// conversation so far.
    RememberAbout(String),
}

/// Longest name "remember this about" takes, in words ("my brother Tom" is three).
const MAX_NAME_WORDS: usize = 4;

/// Polite openers a command may follow ("please remember that …", "hey, forget that …").
const OPENERS: &[&str] = &["please ", "hey, ", "hey ", "ok, ", "okay, ", "and "];

/// The command in `message`, if the message is one. Text outside the command phrase is
/// kept as the user wrote it (trimmed, trailing punctuation dropped).
pub fn parse(message: &str) -> Option<Command> {
    let text = message.trim();
    let lower = text.to_lowercase();
    let mut at = 0;
    for opener in OPENERS {
        if lower.starts_with(opener) {
            at = opener.len();
            break;
        }
    }
    let rest_lower = &lower[at..];
    let take = |phrase: &str| -> Option<String> {
        if !rest_lower.starts_with(phrase) {
            return None;
        }
        let body = text[at + phrase.len()..].trim();
        // "forget that, let's move on": the idiom, not a command.
        if body.starts_with([',', ';', '.', '!', '?']) {
            return None;
        }
        let body = body.trim_end_matches(['.', '!', '?', ' ']).trim();
        (body.chars().count() >= 3).then(|| body.to_string())
    };
    let question = text.ends_with('?');
    if !question {
        for phrase in ["remember this about ", "remember what i said about "] {
            if let Some(name) = take(phrase) {
                // A name, not a clause: "remember this about Tom: he moved" is not this.
                let words = name.split_whitespace().count();
                return (words <= MAX_NAME_WORDS && !name.contains([':', ',', ';']))
                    .then_some(Command::RememberAbout(name));
            }
        }
        if let Some(b) = take("remember that ") {
            return Some(Command::Remember(b));
        }
        if let Some(b) = take("forget that ") {
            return Some(Command::Forget(b));
        }
    }
    for phrase in ["what do you know about ", "what do you remember about "] {
        if let Some(b) = take(phrase) {
            return Some(Command::WhatAbout(b));
        }
    }
    None
}

/// Carries out `cmd` for the turn's own user and character: the reply's opening words,
/// and the remember/forget to queue with the completion. Only reads here; the lane does
/// the writing once the turn commits. A forget that matches nothing queues nothing.
pub async fn carry_out(
    svc: &MemoryService,
    turn: &ClaimedTurn,
    cmd: Command,
) -> (String, Vec<MemoryOp>) {
    match cmd {
        Command::Remember(text) if text.chars().count() <= MAX_TEXT_CHARS => (
            format!("Noted. I'll remember that {}. ", second_person(&text)),
            vec![MemoryOp::Remember(text)],
        ),
        Command::Forget(text) if text.chars().count() <= MAX_TEXT_CHARS => {
            match jobs::forget_matches(svc, &recall::scope(turn), &text).await {
                Ok(found) if found.is_empty() => (
                    format!(
                        "I don't have anything like \"{}\" to forget. ",
                        second_person(&text)
                    ),
                    Vec::new(),
                ),
                Ok(found) => {
                    let what: Vec<&str> = found.iter().map(|m| m.text.as_str()).collect();
                    (
                        format!("Done. I've forgotten: {}. ", what.join("; ")),
                        vec![MemoryOp::Forget(text)],
                    )
                }
                Err(e) => {
                    tracing::warn!(error = %e, "in-chat forget could not be matched");
                    (String::new(), Vec::new())
                }
            }
        }
        Command::WhatAbout(topic) => {
            let found = recall::gather(svc, turn, &topic).await;
            let facts: Vec<&str> = found
                .items
                .iter()
                .take(ANSWER_ITEMS)
                .map(|i| i.text.as_str())
                .collect();
            let prefix = if facts.is_empty() {
                format!("I don't know anything about {topic} yet. ")
            } else {
                format!("Here's what I know about {topic}: {}. ", facts.join("; "))
            };
            (prefix, Vec::new())
        }
        Command::RememberAbout(name) => (
            format!("Noted. I'll remember what you told me about {name}. "),
            vec![MemoryOp::RememberAbout(name)],
        ),
        // Too long for the memory API: an ordinary message.
        Command::Remember(_) | Command::Forget(_) => (String::new(), Vec::new()),
    }
}

/// The user's words about themselves, as the character says them back ("my sister" →
/// "your sister").
pub fn second_person(text: &str) -> String {
    text.split(' ')
        .map(|w| {
            let (core, tail) = w.split_at(w.trim_end_matches([',', '.', '!', '?']).len());
            let swapped = match core.to_lowercase().as_str() {
                "i" => "you",
                "i'm" => "you're",
                "my" => "your",
                "me" => "you",
                "mine" => "yours",
                "myself" => "yourself",
                "am" => "are",
                _ => core,
            };
            format!("{swapped}{tail}")
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_recognised_only_where_they_open_the_message() {
        assert_eq!(
            parse("Remember that my sister Maya lives in Lisbon."),
            Some(Command::Remember("my sister Maya lives in Lisbon".into()))
        );
        assert_eq!(
            parse("please forget that I like jazz"),
            Some(Command::Forget("I like jazz".into()))
        );
        assert_eq!(
            parse("What do you know about Maya?"),
            Some(Command::WhatAbout("Maya".into()))
        );
        assert_eq!(
            parse("Hey, what do you remember about the trip"),
            Some(Command::WhatAbout("the trip".into()))
        );
    }

    #[test]
    fn remember_this_about_takes_a_name_only() {
        assert_eq!(
            parse("Remember this about Florent"),
            Some(Command::RememberAbout("Florent".into()))
        );
        assert_eq!(
            parse("please remember what I said about my brother Tom."),
            Some(Command::RememberAbout("my brother Tom".into()))
        );
        for text in [
            "Remember this about Florent: he moved to Lyon",
            "remember this about the time we all went to the lake together",
            "Remember this about Florent?",
        ] {
            assert_eq!(parse(text), None, "{text}");
        }
    }

    #[test]
    fn look_alikes_are_not_commands() {
        for text in [
            "Do you remember that day at the beach?",
            "Remember that trip we took?",
            "Forget that, let's talk about dogs.",
            "I told her to remember that the shop closes early.",
            "Can you forget that I said that?",
            "remember that",
            "forget that ok",
            "what do you know about",
            "Remembering that is hard.",
        ] {
            assert_eq!(parse(text), None, "{text}");
        }
    }

    #[test]
    fn first_person_becomes_second() {
        assert_eq!(
            second_person("my sister Maya and I are going"),
            "your sister Maya and you are going"
        );
        assert_eq!(
            second_person("I'm moving to Porto."),
            "you're moving to Porto."
        );
    }
}
