//! Seed 004's per-user memory blob: the explicit facts ("remember that …") merged into
//! third-person prose, rebuilt by every remember, forget and "remember this about X". Its
//! own file because the lane and "remember this about X" both rebuild it.

use crate::memory::error::Result;
use crate::memory::service::MemoryService;
use crate::memory::store::Scope;

/// Rewrites a first-person statement in the third person, deterministically ("I live in
/// Lyon" -> "The user lives in Lyon" is beyond it; "my sister" -> "the user's sister" and
/// "I am" -> "the user is" are not). The LLM merge at temperature 0 replaces this when an
/// extraction model is configured.
pub fn third_person(text: &str) -> String {
    let mut out: Vec<String> = Vec::new();
    let words: Vec<&str> = text.split_whitespace().collect();
    let mut i = 0;
    while i < words.len() {
        let w = words[i];
        let lower = w.to_lowercase();
        let (core, tail) = split_punct(&lower);
        let rep = match core {
            "i" if words.get(i + 1).map(|n| n.to_lowercase()) == Some("am".into()) => {
                i += 1;
                Some("the user is".to_string())
            }
            "i'm" | "im" => Some("the user is".to_string()),
            "i" => Some("the user".to_string()),
            "my" => Some("the user's".to_string()),
            "me" => Some("the user".to_string()),
            "mine" => Some("the user's".to_string()),
            "myself" => Some("themself".to_string()),
            _ => None,
        };
        match rep {
            Some(r) => out.push(format!("{r}{tail}")),
            None => out.push(w.to_string()),
        }
        i += 1;
    }
    let s = out.join(" ");
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().collect::<String>() + c.as_str(),
        None => s,
    }
}

fn split_punct(w: &str) -> (&str, &str) {
    let end = w
        .trim_end_matches(|c: char| !c.is_alphanumeric() && c != '\'')
        .len();
    (&w[..end], &w[end..])
}

pub async fn rebuild_blob(svc: &MemoryService, scope: &Scope) -> Result<String> {
    let facts: Vec<String> =
        sqlx::query_scalar(include_str!("../../../sql/memory/explicit_facts.sql"))
            .bind(&scope.user_id)
            .bind(&scope.guild_id)
            .fetch_all(&svc.pool)
            .await?;
    // Newer information wins: facts are keyed, so a superseded one is no longer current.
    let blob = facts
        .iter()
        .map(|f| {
            let t = third_person(f);
            if t.ends_with(['.', '!', '?']) {
                t
            } else {
                format!("{t}.")
            }
        })
        .collect::<Vec<_>>()
        .join(" ");
    sqlx::query(include_str!("../../../sql/memory/blob_upsert.sql"))
        .bind(&scope.user_id)
        .bind(&scope.guild_id)
        .bind(&blob)
        .execute(&svc.pool)
        .await?;
    Ok(blob)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn third_person_rewrites_pronouns() {
        assert_eq!(
            third_person("my sister lives in Lyon"),
            "The user's sister lives in Lyon"
        );
        assert_eq!(third_person("I am vegetarian."), "The user is vegetarian.");
    }
}
