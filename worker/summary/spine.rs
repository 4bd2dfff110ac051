//! Seed 001's summary spine: the long-term picture of a user in four sections (PROFILE,
//! PROJECTS, PEOPLE, OPEN_LOOPS), asked for as grammar-constrained JSON so every version
//! has all four, then rendered as the text a prompt carries.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::llm::Prompt;
use super::{Result, SummaryError, SummaryService};

/// The four sections, each a short list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sections {
    pub profile: Vec<String>,
    pub projects: Vec<String>,
    pub people: Vec<String>,
    pub open_loops: Vec<String>,
}

/// Up to 3 items of 100 characters per section: the longest answer (about 1,300
/// characters) fits the spine's token budget, so a full answer is never cut off.
pub const SPINE_GRAMMAR: &str = r#"
root  ::= "{\"profile\": " arr ", \"projects\": " arr ", \"people\": " arr ", \"open_loops\": " arr "}"
arr   ::= "[" ( str ( ", " str ){0,2} )? "]"
str   ::= "\"" char{3,100} "\""
char  ::= [^"\\\x00-\x1f] | "\\" ["\\/]
"#;

/// What a spine version is made from.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    /// The previous version's text ("" for the first).
    pub previous: String,
    /// Session summaries (seed 001's JSON) since the previous version.
    pub sessions: Value,
    /// The current rolling summaries, one per character.
    pub rolling: Value,
}

pub struct Made {
    pub sections: Sections,
    pub content: String,
    pub elapsed_ms: u64,
}

const SPINE_SYSTEM: &str = "You maintain a long-term summary of one user as JSON with four \
lists. profile: facts about the user. projects: things the user works on. people: people in \
the user's life and who they are. open_loops: unresolved plans or questions. Keep the items of \
the previous summary that still hold and add what the new material says. Short items.";

/// Renders the sections under seed 001's headings.
pub fn render(s: &Sections) -> String {
    let mut out = String::new();
    for (title, items) in [
        ("PROFILE", &s.profile),
        ("PROJECTS", &s.projects),
        ("PEOPLE", &s.people),
        ("OPEN_LOOPS", &s.open_loops),
    ] {
        out.push_str(title);
        out.push_str(":\n");
        if items.is_empty() {
            out.push_str("- (none)\n");
        }
        for i in items {
            out.push_str("- ");
            out.push_str(i.trim());
            out.push('\n');
        }
    }
    out.trim_end().to_string()
}

/// One model call; an answer that does not parse is a model error (the job fails and is
/// recorded, the previous version stays current).
pub async fn make(svc: &SummaryService, inputs: &Inputs) -> Result<Made> {
    let model = svc.model()?;
    let mut lines = Vec::new();
    for s in inputs.sessions.as_array().into_iter().flatten() {
        lines.push(format!("Session: {s}"));
    }
    for r in inputs.rolling.as_array().into_iter().flatten() {
        if let Some(t) = r.as_str() {
            lines.push(format!("Recent: {t}"));
        }
    }
    let prompt = Prompt {
        system: SPINE_SYSTEM.into(),
        header: format!(
            "Previous summary:\n{}\nNew material:",
            if inputs.previous.is_empty() {
                "(none)"
            } else {
                &inputs.previous
            }
        ),
        lines,
        footer: "Updated JSON:".into(),
        grammar: Some(SPINE_GRAMMAR.into()),
        max_tokens: svc.config.spine_max_tokens,
    };
    let g = model
        .generate(prompt)
        .await
        .map_err(|e| SummaryError::Model(e.0))?;
    let sections: Sections = serde_json::from_str(&g.text).map_err(|e| {
        SummaryError::Model(format!(
            "spine answer is not the four-section JSON{}: {e}",
            if g.truncated {
                " (cut off by the token budget)"
            } else {
                ""
            }
        ))
    })?;
    Ok(Made {
        content: render(&sections),
        sections,
        elapsed_ms: g.elapsed_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_all_four_headings_in_order() {
        let s = Sections {
            profile: vec!["Lives in Porto".into()],
            projects: vec![],
            people: vec!["Ana: sister".into(), "Rui: friend".into()],
            open_loops: vec!["Find a flat".into()],
        };
        assert_eq!(
            render(&s),
            "PROFILE:\n- Lives in Porto\nPROJECTS:\n- (none)\nPEOPLE:\n- Ana: sister\n- Rui: friend\nOPEN_LOOPS:\n- Find a flat"
        );
    }
}
