//! The day batch's prompt pieces, apart from the batching itself: seed 004's XML message
//! lines and the grammar that makes the model answer one summary per listed user.

use chrono::{DateTime, Utc};

/// Seed 004's XML message format.
pub fn xml_message(at: DateTime<Utc>, author_id: &str, author: &str, content: &str) -> String {
    let esc = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    format!(
        "<message><timestamp>{}</timestamp><author_id>{}</author_id><author>{}</author><content>{}</content></message>",
        at.format("%Y-%m-%d %H:%M"),
        esc(author_id),
        esc(author),
        esc(&content.split_whitespace().collect::<Vec<_>>().join(" "))
    )
}

/// A GBNF string literal for `s`.
fn gbnf_literal(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\x{:02X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A JSON object with exactly these keys, in order, each a summary string.
pub fn batch_grammar(users: &[String]) -> String {
    let fields: Vec<String> = users
        .iter()
        .map(|u| {
            let key = serde_json::to_string(u).unwrap_or_default();
            format!("{} \": \" str", gbnf_literal(&key))
        })
        .collect();
    format!(
        "root ::= \"{{\" {} \"}}\"\nstr ::= \"\\\"\" char{{10,300}} \"\\\"\"\nchar ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" [\"\\\\/]\n",
        fields.join(" \", \" ")
    )
}
