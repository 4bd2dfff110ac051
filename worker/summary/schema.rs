//! Seed 001's session summary as a checked type: the GBNF grammar the model answers under,
//! and the validation that decides whether an answer may be stored. The grammar makes the
//! answer well-formed; validation catches what a grammar cannot (cut-off answers, blank or
//! repeated items, the seed's own placeholder text copied back).

use serde::{Deserialize, Serialize};

use crate::memory::store::filters::is_text_grounded_in_source;

/// Seed 001's `SessionSummary` JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionSummary {
    pub one_liner: String,
    pub what_mattered: Vec<String>,
    pub open_loops: Vec<String>,
    pub commitments: Vec<String>,
    pub people: Vec<String>,
    pub tone: String,
}

/// Bounds the validation enforces (the grammar enforces the same ones while generating).
/// They keep the longest answer the grammar allows (about 1,300 characters) inside the
/// session summary's token budget: with 4 items of 160 characters SmolLM2 filled every
/// string and was cut off three times out of three in the demo.
pub const MAX_ITEMS: usize = 3;
pub const MAX_TEXT_CHARS: usize = 100;
pub const MAX_TONE_CHARS: usize = 40;
/// A person is a name: a few words, not a sentence (the grammar: up to 3 capitalised
/// words of up to 12 letters).
pub const MAX_NAME_CHARS: usize = 40;
pub const MAX_NAME_WORDS: usize = 4;

/// Keys in seed 001's order; `what_mattered` has at least one item; `people` holds names.
pub const SESSION_GRAMMAR: &str = r#"
root  ::= "{\"one_liner\": " str ", \"what_mattered\": " arr1 ", \"open_loops\": " arr ", \"commitments\": " arr ", \"people\": " names ", \"tone\": " tone "}"
arr1  ::= "[" str ( ", " str ){0,2} "]"
arr   ::= "[" ( str ( ", " str ){0,2} )? "]"
names ::= "[" ( name ( ", " name ){0,2} )? "]"
str   ::= "\"" char{3,100} "\""
name  ::= "\"" cap ( " " cap ){0,2} "\""
cap   ::= [A-Z] [a-z'-]{1,11}
tone  ::= "\"" char{3,40} "\""
char  ::= [^"\\\x00-\x1f] | "\\" ["\\/]
"#;

/// The seed's example values: a model that copies them back has summarised nothing.
const PLACEHOLDERS: &[&str] = &[
    "brief session description",
    "key topic 1",
    "key topic 2",
    "unresolved item",
    "promised action",
    "mentioned people",
    "emotional quality",
];

/// Why an answer was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("not valid JSON for the schema: {0}")]
    Parse(String),
    #[error("the answer was cut off by the token budget")]
    Truncated,
    #[error("{field} is blank")]
    Blank { field: &'static str },
    #[error("{field} is over {max} characters")]
    TooLong { field: &'static str, max: usize },
    #[error("{field} has more than {MAX_ITEMS} items")]
    TooMany { field: &'static str },
    #[error("what_mattered is empty")]
    NothingMattered,
    #[error("{field} repeats an item")]
    Repeated { field: &'static str },
    #[error("{field} copies the schema's placeholder text")]
    Placeholder { field: &'static str },
    #[error("{field} copies the instructions instead of the conversation: {item:?}")]
    Echo { field: &'static str, item: String },
    #[error("people holds {0:?}, which is not a name")]
    NotAName(String),
}

/// Parses and validates a model answer.
pub fn validate(raw: &str, truncated: bool) -> Result<SessionSummary, Invalid> {
    let s: SessionSummary = serde_json::from_str(raw.trim()).map_err(|e| match truncated {
        true => Invalid::Truncated,
        false => Invalid::Parse(e.to_string()),
    })?;
    text("one_liner", &s.one_liner, MAX_TEXT_CHARS)?;
    text("tone", &s.tone, MAX_TONE_CHARS)?;
    if s.what_mattered.is_empty() {
        return Err(Invalid::NothingMattered);
    }
    list("what_mattered", &s.what_mattered)?;
    list("open_loops", &s.open_loops)?;
    list("commitments", &s.commitments)?;
    list("people", &s.people)?;
    for p in &s.people {
        let words = p.split_whitespace().count();
        if p.chars().count() > MAX_NAME_CHARS || words > MAX_NAME_WORDS {
            return Err(Invalid::NotAName(p.clone()));
        }
    }
    Ok(s)
}

/// [`validate`], then drops from `people` any entry that is not a name written in the
/// conversation (a small model writes a section word such as "People", or a capitalised
/// fragment of a line, there; one stray entry is no reason to refuse a summary whose other
/// fields are sound, and the raw answer is kept beside the stored summary), then refuses an answer that restates the instructions instead of the
/// conversation (a small model copies its prompt's wording into the fields): a field whose
/// words come from `instructions` and not from `conversation` is an echo. The tone is
/// exempt: its words rarely appear in a conversation.
pub fn validate_against(
    raw: &str,
    truncated: bool,
    conversation: &str,
    instructions: &str,
) -> Result<SessionSummary, Invalid> {
    let mut s = validate(raw, truncated)?;
    s.people.retain(|p| named_in(p, conversation));
    let echo = |item: &str| {
        is_text_grounded_in_source(item, instructions)
            && !is_text_grounded_in_source(item, conversation)
    };
    let fields: [(&'static str, &[String]); 4] = [
        ("what_mattered", &s.what_mattered),
        ("open_loops", &s.open_loops),
        ("commitments", &s.commitments),
        ("people", &s.people),
    ];
    let items = fields
        .iter()
        .flat_map(|(f, items)| items.iter().map(move |i| (*f, i.as_str())));
    for (field, item) in std::iter::once(("one_liner", s.one_liner.as_str())).chain(items) {
        if echo(item) {
            let item = item.to_string();
            return Err(Invalid::Echo { field, item });
        }
    }
    Ok(s)
}

/// True when `name` is a name as the conversation writes it: every word capitalised, and
/// the whole found verbatim there between word boundaries.
fn named_in(name: &str, conversation: &str) -> bool {
    let name = name.trim();
    let capitalised = name
        .split_whitespace()
        .all(|w| w.chars().next().is_some_and(char::is_uppercase));
    let boundary = |c: Option<char>| !c.is_some_and(char::is_alphanumeric);
    !name.is_empty()
        && capitalised
        && conversation.match_indices(name).any(|(at, _)| {
            boundary(conversation[..at].chars().next_back())
                && boundary(conversation[at + name.len()..].chars().next())
        })
}

fn text(field: &'static str, v: &str, max: usize) -> Result<(), Invalid> {
    let t = v.trim();
    if t.is_empty() {
        return Err(Invalid::Blank { field });
    }
    if t.chars().count() > max {
        return Err(Invalid::TooLong { field, max });
    }
    if PLACEHOLDERS.contains(&t.to_lowercase().as_str()) {
        return Err(Invalid::Placeholder { field });
    }
    Ok(())
}

fn list(field: &'static str, items: &[String]) -> Result<(), Invalid> {
    if items.len() > MAX_ITEMS {
        return Err(Invalid::TooMany { field });
    }
    let mut seen: Vec<String> = Vec::new();
    for item in items {
        text(field, item, MAX_TEXT_CHARS)?;
        let key = item.trim().to_lowercase();
        if seen.contains(&key) {
            return Err(Invalid::Repeated { field });
        }
        seen.push(key);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const INSTRUCTIONS: &str = "commitments: what someone promised to do. open_loops: \
questions or plans left unresolved. people: names of people mentioned.";
    const TALK: &str = "User: I moved to Porto with my sister Ana. I promised Ana I would \
visit three flats on Saturday.";

    #[test]
    fn an_answer_that_copies_the_instructions_is_refused() {
        // After SmolLM2-135M's answer in the first demo run (2026-11-23), which copied the
        // field descriptions; `people` now only takes names from the conversation.
        let copied = r#"{"one_liner": "Sam moved to Porto.", "what_mattered": ["moving to Porto"], "open_loops": ["Questions or plans left unresolved"], "commitments": ["What someone promised to do"], "people": ["Ana"], "tone": "calm"}"#;
        assert_eq!(
            validate_against(copied, false, TALK, INSTRUCTIONS),
            Err(Invalid::Echo {
                field: "open_loops",
                item: "Questions or plans left unresolved".into()
            })
        );
        let grounded = r#"{"one_liner": "Sam moved to Porto with Ana.", "what_mattered": ["moving to Porto"], "open_loops": ["find a flat"], "commitments": ["visit three flats on Saturday"], "people": ["Ana"], "tone": "hopeful"}"#;
        let s = validate_against(grounded, false, TALK, INSTRUCTIONS).unwrap();
        assert_eq!(s.commitments, vec!["visit three flats on Saturday"]);
        // A name the conversation lacks is dropped, not a reason to refuse the rest.
        for strangers in [
            r#"["People", "Ana", "Rui"]"#,
            r#"["my sister", "An", "Ana"]"#,
            r#"["Ana", "Moved To", "Porto With"]"#,
        ] {
            let answer = grounded.replace(r#"["Ana"]"#, strangers);
            let s = validate_against(&answer, false, TALK, INSTRUCTIONS).unwrap();
            assert_eq!(s.people, vec!["Ana"], "{strangers}");
            assert_eq!(s.commitments, vec!["visit three flats on Saturday"]);
        }
    }

    const GOOD: &str = r#"{"one_liner": "Sam planned a move to Porto.", "what_mattered": ["moving to Porto"], "open_loops": ["find a flat"], "commitments": [], "people": ["Ana"], "tone": "hopeful"}"#;

    #[test]
    fn a_valid_answer_parses() {
        let s = validate(GOOD, false).unwrap();
        assert_eq!(s.one_liner, "Sam planned a move to Porto.");
        assert_eq!(s.people, vec!["Ana"]);
        assert!(s.commitments.is_empty());
    }

    #[test]
    fn invalid_answers_are_refused_with_a_reason() {
        let cut = &GOOD[..40];
        assert_eq!(validate(cut, true), Err(Invalid::Truncated));
        assert!(matches!(validate(cut, false), Err(Invalid::Parse(_))));
        let extra = GOOD.replace("\"tone\"", "\"mood\": \"x\", \"tone\"");
        assert!(matches!(validate(&extra, false), Err(Invalid::Parse(_))));
        let blank = GOOD.replace("\"hopeful\"", "\"   \"");
        assert_eq!(
            validate(&blank, false),
            Err(Invalid::Blank { field: "tone" })
        );
        let none = GOOD.replace("[\"moving to Porto\"]", "[]");
        assert_eq!(validate(&none, false), Err(Invalid::NothingMattered));
        let rep = GOOD.replace("[\"Ana\"]", "[\"Ana\", \"ana \"]");
        assert_eq!(
            validate(&rep, false),
            Err(Invalid::Repeated { field: "people" })
        );
        let copy = GOOD.replace("Sam planned a move to Porto.", "Brief session description");
        assert_eq!(
            validate(&copy, false),
            Err(Invalid::Placeholder { field: "one_liner" })
        );
        let many = GOOD.replace("[\"find a flat\"]", "[\"a1\", \"a2\", \"a3\", \"a4\"]");
        assert_eq!(
            validate(&many, false),
            Err(Invalid::TooMany {
                field: "open_loops"
            })
        );
        let sentence = GOOD.replace(
            "[\"Ana\"]",
            "[\"I'm glad to hear that you're taking time off\"]",
        );
        assert!(matches!(
            validate(&sentence, false),
            Err(Invalid::NotAName(_))
        ));
        let long = GOOD.replace("hopeful", &"h".repeat(41));
        assert_eq!(
            validate(&long, false),
            Err(Invalid::TooLong {
                field: "tone",
                max: 40
            })
        );
    }
}
