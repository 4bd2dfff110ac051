//! The question in the named speaker's own voice. People tell about themselves in the
//! first person: "How much did Dana's wheel cost?" is answered by Dana saying "I got my
//! wheel for $350". When a question names exactly one speaker of the dialogue, the search
//! also embeds it as that speaker would say it ("How much did my wheel cost?") and scores
//! that speaker's turns by it too.

use std::collections::HashSet;

use sqlx::PgPool;

use super::super::error::Result;

/// The speaker of the user's dialogue that the query names, when it names exactly one
/// (whole word, any case; naming both speakers of a dialogue prefers neither).
pub(super) async fn named_speaker(
    pool: &PgPool,
    user: &str,
    query: &str,
) -> Result<Option<String>> {
    let speakers: Vec<String> =
        sqlx::query_scalar(include_str!("../../../sql/memory/speakers.sql"))
            .persistent(false)
            .bind(user)
            .fetch_all(pool)
            .await?;
    let words: HashSet<String> = words(query).map(str::to_lowercase).collect();
    let mut named = speakers.into_iter().filter(|s| {
        let first = first_name(s).to_lowercase();
        first.chars().count() >= 2 && words.contains(&first)
    });
    Ok(match (named.next(), named.next()) {
        (Some(one), None) => Some(one),
        _ => None,
    })
}

fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
}

fn first_name(speaker: &str) -> &str {
    speaker.split_whitespace().next().unwrap_or("")
}

/// The query as `speaker` would ask it of themself: their name's possessive becomes "my",
/// the name itself "I". Grammar is left as it falls ("does I"): the embedder reads the
/// words, and the person is what moves the vector.
pub fn first_person(query: &str, speaker: &str) -> String {
    let name = first_name(speaker).to_lowercase();
    let mut out = String::with_capacity(query.len());
    let mut rest = query;
    while let Some(start) = rest.find(|c: char| c.is_alphanumeric()) {
        out.push_str(&rest[..start]);
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !c.is_alphanumeric())
            .unwrap_or(tail.len());
        let (word, after) = tail.split_at(end);
        if word.to_lowercase() != name {
            out.push_str(word);
            rest = after;
            continue;
        }
        match after
            .strip_prefix("'s")
            .or_else(|| after.strip_prefix("’s"))
        {
            Some(after_possessive) => {
                out.push_str("my");
                rest = after_possessive;
            }
            None => {
                out.push('I');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::first_person;

    #[test]
    fn the_named_speaker_asks_in_the_first_person() {
        assert_eq!(
            first_person("How much did Dana's secondhand wheel cost?", "Dana"),
            "How much did my secondhand wheel cost?"
        );
        assert_eq!(
            first_person("What does tomás do when Tomás’s shift ends?", "Tomás Ruiz"),
            "What does I do when my shift ends?"
        );
        // A longer word that starts with the name is another word.
        assert_eq!(
            first_person("Did Dan ever meet Danny?", "Dan"),
            "Did I ever meet Danny?"
        );
    }
}
