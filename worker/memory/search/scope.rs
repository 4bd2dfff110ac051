//! The scope filter every retrieval leg's SQL repeats (the user is a wall, the character
//! filters, the guild is a wall, the as-of cut): statements are files loaded whole, so the
//! filter is written in each, and this test holds each leg to it. A new `search_*.sql`
//! the search loads must be listed here, or the test fails.

use std::path::Path;

/// The legs that read message candidates, each under the whole message scope.
const MESSAGE_LEGS: &[&str] = &[
    "search_messages_bm25.sql",
    "search_messages_vectors.sql",
    "search_messages_vectors_exact.sql",
    "search_spans_exact.sql",
    "search_spans_index.sql",
    "window_messages.sql",
];

/// The message scope, with table aliases and whitespace taken out.
const MESSAGE_SCOPE: &[&str] = &[
    "user_id = $1",
    "($2::bigint IS NULL OR character_id = $2 OR character_id IS NULL)",
    "(guild_id = $3 OR (guild_id IS NULL AND $3::text IS NULL))",
    "($4::timestamptz IS NULL OR at <= $4)",
];

/// The facts leg: the same walls (its as-of cut is a validity interval of its own).
const FACT_SCOPE: &[&str] = &[
    "user_id = $1",
    "($2::bigint IS NULL OR character_id = $2 OR character_id IS NULL)",
    "guild_id IS NOT DISTINCT FROM $3",
];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A statement without comments, aliases or line breaks: `m.user_id` reads `user_id`.
fn normalised(file: &str) -> String {
    let text = std::fs::read_to_string(root().join("sql/memory").join(file)).unwrap();
    let code: Vec<&str> = text
        .lines()
        .map(|l| l.split("--").next().unwrap())
        .collect();
    let mut out = String::new();
    for word in code.join(" ").split_whitespace() {
        let opened = word.len() - word.trim_start_matches('(').len();
        let (parens, rest) = word.split_at(opened);
        let rest = match rest.split_once('.') {
            Some((alias, col))
                if alias.chars().all(|c| c.is_ascii_lowercase())
                    && ["user_id", "character_id", "guild_id", "at"]
                        .iter()
                        .any(|c| col.starts_with(c)) =>
            {
                col
            }
            _ => rest,
        };
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(parens);
        out.push_str(rest);
    }
    out.replace("( ", "(").replace(" )", ")")
}

fn missing(file: &str, scope: &[&str]) -> Vec<String> {
    let sql = normalised(file);
    scope
        .iter()
        .filter(|f| !sql.contains(*f))
        .map(|f| format!("{file}: {f}"))
        .collect()
}

#[test]
fn every_leg_carries_the_scope_filter() {
    let mut gaps: Vec<String> = MESSAGE_LEGS
        .iter()
        .flat_map(|f| missing(f, MESSAGE_SCOPE))
        .collect();
    gaps.extend(missing("current_facts.sql", FACT_SCOPE));
    assert!(gaps.is_empty(), "scope clauses missing: {gaps:#?}");
}

#[test]
fn every_search_statement_the_search_loads_is_a_listed_leg() {
    let dir = root().join("worker/memory/search");
    let mut unlisted = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for part in text.split("sql/memory/").skip(1) {
            let file = part.split('"').next().unwrap();
            if file.starts_with("search_") && !MESSAGE_LEGS.contains(&file) {
                unlisted.push(file.to_string());
            }
        }
    }
    assert!(
        unlisted.is_empty(),
        "legs without a scope check: {unlisted:?}"
    );
}
