//! Whom a fact is about: the leading name checked against the speaker and the message,
//! and the entity a fact about someone else is filed under.

use crate::memory::ingest::extract::candidate::{slug, FactCandidate};
use crate::memory::ingest::extract::words::{
    capitalised, lower_words, mentions, names_in, same_name, split_clauses, CLAUSE_JOINS, COMMON,
    LINKING, RELATIONS,
};
use crate::memory::store::filters::{FactType, Reason};
use crate::memory::store::Kind as MemoryKind;

/// Whom the fact is about: its leading name ("Sam's sister …" is about Sam's sister, and
/// starts with Sam). The speaker, or a name the message holds; never "I" or "my".
pub(super) fn subject_of(fact: &str, speaker: &str, message: &str) -> Result<String, Reason> {
    let first = fact
        .split_whitespace()
        .next()
        .unwrap_or("")
        .trim_end_matches(['.', ',', ':', ';', '!', '?']);
    let name = first
        .strip_suffix("'s")
        .or_else(|| first.strip_suffix("’s"))
        .unwrap_or(first);
    // A live turn's speaker is the role "User", which is also a word models put first in
    // place of a name: it is a subject only when it is the speaker.
    if !name.is_empty() && same_name(name, speaker) {
        return Ok(name.to_string());
    }
    let pronoun = matches!(
        name.to_lowercase().as_str(),
        "i" | "im"
            | "i'm"
            | "my"
            | "me"
            | "we"
            | "our"
            | "you"
            | "your"
            | "he"
            | "she"
            | "they"
            | "his"
            | "her"
            | "their"
            | "the"
            | "a"
            | "an"
            | "user"
            | "speaker"
    );
    if pronoun || name.is_empty() {
        return Err(Reason::Subject);
    }
    if mentions(message, name) {
        Ok(name.to_string())
    } else {
        Err(Reason::Subject)
    }
}

/// The fact with its entity: a fact about someone other than the speaker is about that
/// person, and a relationship names people the message names.
pub(super) fn candidate(
    text: String,
    fact_type: FactType,
    subject: &str,
    speaker: &str,
    message: &str,
) -> FactCandidate {
    let third = !same_name(subject, speaker);
    let mut refs = Vec::new();
    if third {
        refs.push(format!("person:{}", slug(subject)));
    }
    if fact_type == FactType::Relationship {
        for name in names_in(&text).into_iter().skip(1) {
            let key = format!("person:{}", slug(&name));
            if !same_name(&name, speaker) && mentions(message, &name) && !refs.contains(&key) {
                refs.push(key);
            }
        }
    }
    let kind = match fact_type {
        _ if third => MemoryKind::People,
        FactType::Relationship => MemoryKind::People,
        FactType::Project => MemoryKind::Project,
        _ => MemoryKind::Profile,
    };
    FactCandidate {
        text,
        fact_type,
        kind,
        entity_type: third.then(|| "person".to_string()),
        entity_label: third.then(|| subject.to_string()),
        entity_refs: refs,
        importance: 1,
        confidence: 0.7,
        evidence: None,
    }
}

/// The first "my <relation>" among `words`: where it starts, the relation, and the name
/// that follows when one does ("my sister ines" names her; "my sister is" does not).
pub(super) fn relation_in(words: &[&str]) -> Option<(usize, String, Option<String>)> {
    let lower: Vec<String> = words.iter().map(|w| w.to_lowercase()).collect();
    let i = (0..lower.len().saturating_sub(1))
        .find(|&i| lower[i] == "my" && RELATIONS.contains(&lower[i + 1].as_str()))?;
    let who = lower
        .get(i + 2)
        .filter(|w| !COMMON.contains(&w.as_str()) && w.chars().all(char::is_alphabetic))
        .map(|_| capitalised(words[i + 2]));
    Some((i, lower[i + 1].clone(), who))
}

/// Every named relation in the message, as (relation, Name).
pub(super) fn named_relations(message: &str) -> Vec<(String, String)> {
    split_clauses(message, CLAUSE_JOINS)
        .iter()
        .filter_map(|c| {
            let words: Vec<&str> = c.split_whitespace().collect();
            match relation_in(&words) {
                Some((_, rel, Some(who))) => Some((rel, who)),
                _ => None,
            }
        })
        .collect()
}

/// "Jonas's daughter lotte is 5" as "Lotte is 5" when the message names Jonas's daughter
/// Lotte; a line that states the relation itself ("Sam's sister is Priya") stays.
pub(super) fn resolve_relation(line: &str, speaker: &str, named: &[(String, String)]) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    let (Some(first), Some(second)) = (words.first(), words.get(1)) else {
        return line.to_string();
    };
    let owner = first
        .strip_suffix("'s")
        .or_else(|| first.strip_suffix("’s"));
    if !owner.is_some_and(|o| same_name(o, speaker)) {
        return line.to_string();
    }
    let rel = second.trim_end_matches(['.', ',']).to_lowercase();
    let Some((_, who)) = named.iter().find(|(r, _)| *r == rel) else {
        return line.to_string();
    };
    let skip = if words
        .get(2)
        .is_some_and(|w| w.trim_end_matches(['.', ',']).eq_ignore_ascii_case(who))
    {
        3
    } else {
        2
    };
    let rest = words[skip..].join(" ");
    if rest.is_empty() || mentions(&rest, who) {
        return line.to_string();
    }
    format!("{who} {rest}")
}

/// A fact that says the speaker did what the message says someone else did: "Sam is a
/// drummer" from "my flatmate jordan is a drummer". True when every content word of the
/// fact that the message holds sits only in clauses about another person (opening with
/// "my <relation>" or he / she / they).
pub(super) fn third_party_only(fact: &str, subject: &str, speaker: &str, message: &str) -> bool {
    let about_speaker = same_name(subject, speaker)
        && !fact
            .split_whitespace()
            .next()
            .is_some_and(|w| w.ends_with("'s") || w.ends_with("’s"));
    if !about_speaker {
        return false;
    }
    let clauses: Vec<(bool, Vec<String>)> = split_clauses(message, CLAUSE_JOINS)
        .iter()
        .map(|c| {
            let words: Vec<&str> = c.split_whitespace().collect();
            let lower = lower_words(c);
            let other = matches!(relation_in(&words), Some((0, _, _)))
                || lower.first().is_some_and(|w| {
                    ["he", "she", "hes", "shes", "they", "theyre", "his", "her"]
                        .contains(&w.as_str())
                });
            (other, lower)
        })
        .collect();
    let speaker_lower = speaker.to_lowercase();
    let mut found = false;
    for w in lower_words(fact) {
        // The relation word is the speaker's own ("Sam has a sister").
        let skip = [LINKING, RELATIONS]
            .iter()
            .any(|set| set.contains(&w.as_str()));
        if w.len() <= 3 || skip || speaker_lower.starts_with(&w) {
            continue;
        }
        let mut holders = clauses.iter().filter(|(_, c)| c.contains(&w)).peekable();
        if holders.peek().is_none() {
            continue;
        }
        found = true;
        if holders.any(|(other, _)| !other) {
            return false;
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_relation_is_its_own_subject() {
        let msg = "my daughter lotte is 5 and she stays with me every other weekend";
        let named = named_relations(msg);
        assert_eq!(named, [("daughter".to_string(), "Lotte".to_string())]);
        assert_eq!(
            resolve_relation("Jonas's daughter lotte is 5.", "Jonas", &named),
            "Lotte is 5."
        );
        assert_eq!(
            resolve_relation("Jonas's daughter is Lotte.", "Jonas", &named),
            "Jonas's daughter is Lotte."
        );
        assert_eq!(
            resolve_relation("Jonas's son is 5.", "Jonas", &named),
            "Jonas's son is 5."
        );
    }

    #[test]
    fn what_someone_else_does_is_not_the_speakers() {
        let msg = "my flatmate jordan is a drummer and practices at like midnight, i work early";
        assert!(third_party_only("Sam is a drummer.", "Sam", "Sam", msg));
        assert!(!third_party_only(
            "Jordan is a drummer.",
            "Jordan",
            "Sam",
            msg
        ));
        assert!(!third_party_only("Sam works early.", "Sam", "Sam", msg));
        assert!(!third_party_only(
            "Sam's flatmate is a drummer.",
            "Sam",
            "Sam",
            msg
        ));
    }
}
