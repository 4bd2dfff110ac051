//! Seed 001's session summary as a checked type: the GBNF grammar the model answers under,
//! and the validation that decides whether an answer may be stored. The grammar makes the
//! answer well-formed; validation catches what a grammar cannot (cut-off answers, blank or
//! repeated items, the seed's own placeholder text copied back).

use serde::{Deserialize, Serialize};

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
pub const MAX_ITEMS: usize = 4;
pub const MAX_TEXT_CHARS: usize = 160;
pub const MAX_TONE_CHARS: usize = 40;

/// Keys in seed 001's order; `what_mattered` has at least one item.
pub const SESSION_GRAMMAR: &str = r#"
root  ::= "{\"one_liner\": " str ", \"what_mattered\": " arr1 ", \"open_loops\": " arr ", \"commitments\": " arr ", \"people\": " arr ", \"tone\": " tone "}"
arr1  ::= "[" str ( ", " str ){0,3} "]"
arr   ::= "[" ( str ( ", " str ){0,3} )? "]"
str   ::= "\"" char{3,160} "\""
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
    Ok(s)
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
        let many = GOOD.replace(
            "[\"find a flat\"]",
            "[\"a1\", \"a2\", \"a3\", \"a4\", \"a5\"]",
        );
        assert_eq!(
            validate(&many, false),
            Err(Invalid::TooMany {
                field: "open_loops"
            })
        );
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
