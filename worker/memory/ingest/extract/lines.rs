//! The extraction answer as plain lines: `"- <name> <fact>"`, one fact per line. A small
//! model writes a short list far faster than JSON whose fixed keys it must decode one token
//! at a time, and it copies the message better than it fills typed fields; the fact's type,
//! kind and entity come from rules over the line instead, and its subject is checked
//! against the message and the speaker.

use crate::memory::ingest::extract::candidate::{Extraction, MAX_FACTS};
use crate::memory::ingest::extract::subject::{
    candidate, named_relations, relation_in, resolve_relation, subject_of, third_party_only,
};
use crate::memory::ingest::extract::words::{
    lower_words, same_name, split_clauses, ADVERBS, CLAUSE_JOINS, LINKING, NEGATION_JOINS, PETS,
    PREFERENCES, PROJECTS, RELATIONS,
};
use crate::memory::store::filters::{
    check_fact, clean_text, dedup_key, has_negation, ungrounded_words, FactType, Reason, Verdict,
};

/// One to four lines, each a bullet, a capital, then up to 120 characters: the grammar
/// guarantees the parse, the model decides how many facts (at least one: whether a
/// message holds a fact is the filters' call, after the skip rule).
pub const LINES_GRAMMAR: &str = r#"
root ::= line{1,4}
line ::= "- " [A-Z] [^\n]{4,118} "\n"
"#;

pub const LINES_SYSTEM: &str = "List what the chat message tells about people: one fact per \
line, each a short sentence that starts with the person's name and copies the message's \
words. A fact about the speaker starts with the speaker's name; a fact about someone the \
speaker names starts with that person's name. Keep \"not\" and \"never\".\n\
Example: \"Dana: I moved to Oslo in May, I don't eat meat and my brother Tom teaches chemistry.\" \
gives:\n- Dana moved to Oslo in May.\n- Dana does not eat meat.\n- Dana's brother is Tom.\n- Tom teaches chemistry.";

/// Turns the model's lines into filtered facts: every line runs through seed 002's filters
/// with `"<speaker>: <text>"` as the source, then the subject rule (the fact starts with
/// the speaker's name or a name the message holds), strict grounding (every content word
/// in the message but the rewrite's linking verbs) and the negation rule. Pure, so it is
/// tested on hand-written answers.
pub fn postprocess(raw: &str, speaker: &str, text: &str, truncated: bool) -> Extraction {
    let mut ex = Extraction {
        raw: raw.to_string(),
        truncated,
        ..Extraction::default()
    };
    let source = format!("{speaker}: {text}");
    let mut seen = Vec::new();
    let relations = named_relations(text);
    for line in raw.lines().map(|l| third_person(&clean_text(l), speaker)) {
        if line.is_empty() {
            continue;
        }
        // "Rosa's husband works nights" about Rosa's husband Pablo, named in the message,
        // is about Pablo.
        let line = resolve_relation(&line, speaker, &relations);
        if let Some(r) = shape_reason(&line, speaker) {
            ex.rejected.record(&r);
            continue;
        }
        let fact_type = type_of(&line);
        let clean = match check_fact(&line, fact_type.as_str(), None, &source) {
            Verdict::Accepted(c) => c,
            Verdict::Rejected(r) => {
                ex.rejected.record(&r);
                continue;
            }
        };
        let subject = match subject_of(&clean.text, speaker, text) {
            Ok(s) => s,
            Err(r) => {
                ex.rejected.record(&r);
                continue;
            }
        };
        if third_party_only(&clean.text, &subject, speaker, text) {
            ex.rejected.record(&Reason::Subject);
            continue;
        }
        if let Some(r) = strict_reason(&clean.text, &subject, &source) {
            ex.rejected.record(&r);
            continue;
        }
        let key = dedup_key(&clean.text);
        if seen.contains(&key) {
            ex.rejected.record(&Reason::Duplicate);
            continue;
        }
        if ex.facts.len() >= MAX_FACTS {
            ex.rejected.record(&Reason::OverCap);
            continue;
        }
        seen.push(key);
        ex.facts
            .push(candidate(clean.text, fact_type, &subject, speaker, text));
    }
    ex
}

/// Candidate lines read off the message itself, beside the model's: each first-person
/// clause in the third person ("i swim every morning" is "Sam swims every morning"), and
/// "my sister hana …" as the relation ("Sam's sister is hana") and a clause about hana.
/// The same filters judge them; they cost no model time.
pub fn clause_lines(speaker: &str, text: &str) -> Vec<String> {
    let name = speaker.split_whitespace().next().unwrap_or(speaker);
    let mut out = Vec::new();
    for clause in split_clauses(text, CLAUSE_JOINS)
        .into_iter()
        .filter(|c| c.split_whitespace().count() >= 3)
    {
        let words: Vec<&str> = clause.split_whitespace().collect();
        let lower: Vec<String> = words.iter().map(|w| w.to_lowercase()).collect();
        if let Some((i, rel, Some(who))) = relation_in(&words) {
            if PETS.contains(&rel.as_str()) {
                out.push(format!("{name} has a {rel} named {who}."));
            } else {
                out.push(format!("{who} is {name}'s {rel}."));
            }
            let rest = words[i + 3..].join(" ");
            if i == 0 && !rest.is_empty() {
                out.push(rewrite_first_person(&format!("{who} {rest}"), name));
            }
            continue;
        }
        let first = lower.first().map(String::as_str).unwrap_or("");
        if matches!(first, "i" | "im" | "i'm" | "ive" | "i've" | "my") && words.len() >= 3 {
            out.push(rewrite_first_person(&clause, name));
        }
    }
    out
}

/// The model's line as a third-person fact about its subject. Small models echo the
/// message: "Rosa: my two kids are 7 and 4" becomes "Rosa's two kids are 7 and 4", "Sam:
/// I'm a nurse" becomes "Sam is a nurse", and a misspelt speaker ("Nara" for Nora) is the
/// speaker. What stays first person is rejected by the subject rule.
pub fn third_person(line: &str, speaker: &str) -> String {
    let speaker_first = speaker.split_whitespace().next().unwrap_or(speaker);
    let (name, rest) = match line.split_once(':') {
        Some((n, r)) if n.split_whitespace().count() == 1 && !r.trim().is_empty() => {
            (Some(n.trim()), r.trim())
        }
        _ => (None, line.trim()),
    };
    let name = name.map(|n| {
        if near_name(n, speaker_first) {
            speaker_first
        } else {
            n
        }
    });
    let rest = fix_leading_name(rest, speaker_first);
    let subject = name.unwrap_or(speaker_first);
    let rewritten = rewrite_first_person(&rest, subject);
    match name {
        Some(n) if !starts_with_name(&rewritten, n) => format!("{n}: {rewritten}"),
        _ => rewritten,
    }
}

/// A leading word one letter off the speaker's name is the speaker's name.
fn fix_leading_name(text: &str, speaker: &str) -> String {
    let first = text.split_whitespace().next().unwrap_or("");
    let bare = first
        .trim_end_matches("'s")
        .trim_end_matches(['.', ',', ':']);
    if bare != speaker && near_name(bare, speaker) {
        return text.replacen(bare, speaker, 1);
    }
    text.to_string()
}

fn starts_with_name(text: &str, name: &str) -> bool {
    let first = text.split_whitespace().next().unwrap_or("");
    let bare = first
        .trim_end_matches("'s")
        .trim_end_matches(['.', ',', ':']);
    bare.eq_ignore_ascii_case(name)
}

/// Same length, one letter different, four letters or more: a misspelling of `name`.
fn near_name(word: &str, name: &str) -> bool {
    let (a, b): (Vec<char>, Vec<char>) = (
        word.to_lowercase().chars().collect(),
        name.to_lowercase().chars().collect(),
    );
    a.len() == b.len() && a.len() >= 4 && a.iter().zip(&b).filter(|(x, y)| x != y).count() <= 1
}

/// "I", "me" and "my" as `name`, with the verb after "I" agreeing ("I swim" is "Sam swims",
/// "I don't" is "Sam does not").
fn rewrite_first_person(text: &str, name: &str) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut after_i = false;
    for w in text.split_whitespace() {
        let (core, tail) = split_punct(w);
        let lower = core.to_lowercase().replace('’', "'");
        let replaced: Option<String> = match lower.as_str() {
            "i" => Some(name.to_string()),
            "i'm" | "im" => Some(format!("{name} is")),
            "i've" | "ive" => Some(format!("{name} has")),
            "i'll" => Some(format!("{name} will")),
            "i'd" => Some(format!("{name} would")),
            "me" => Some(name.to_string()),
            "my" | "mine" => Some(format!("{name}'s")),
            "myself" => Some(name.to_string()),
            _ => None,
        };
        if let Some(r) = replaced {
            after_i = lower == "i";
            out.push(format!("{r}{tail}"));
            continue;
        }
        if after_i {
            if ADVERBS.contains(&lower.as_str()) {
                out.push(w.to_string());
                continue;
            }
            out.push(format!("{}{tail}", agree(&lower, core)));
            after_i = false;
            continue;
        }
        out.push(w.to_string());
    }
    out.join(" ")
}

/// A first-person present verb in the third person; anything else as it was.
fn agree(lower: &str, original: &str) -> String {
    const KEEP: &[&str] = &[
        "can", "cant", "can't", "cannot", "will", "wont", "won't", "would", "could", "should",
        "must", "might", "may", "was", "did", "didnt", "didn't", "had", "got", "used",
    ];
    match lower {
        "am" => "is".into(),
        "have" => "has".into(),
        "do" => "does".into(),
        "dont" | "don't" => "does not".into(),
        "haven't" | "havent" => "has not".into(),
        "were" => "was".into(),
        "go" => "goes".into(),
        _ if KEEP.contains(&lower)
            || lower.ends_with("ed")
            || lower.ends_with('s')
            || !lower.chars().all(|c| c.is_ascii_alphabetic()) =>
        {
            original.to_string()
        }
        _ if lower.ends_with("sh") || lower.ends_with("ch") || lower.ends_with('x') => {
            format!("{original}es")
        }
        _ if lower.ends_with('y')
            && !lower.ends_with("ay")
            && !lower.ends_with("ey")
            && !lower.ends_with("oy") =>
        {
            format!("{}ies", &original[..original.len() - 1])
        }
        _ => format!("{original}s"),
    }
}

/// A word and its trailing punctuation.
fn split_punct(w: &str) -> (&str, &str) {
    let cut = w
        .char_indices()
        .rev()
        .take_while(|(_, c)| matches!(c, '.' | ',' | ';' | ':' | '!' | '?'))
        .last()
        .map_or(w.len(), |(i, _)| i);
    (&w[..cut], &w[cut..])
}

/// The fact's type by its words: relations, then likes, then projects, else profile.
fn type_of(line: &str) -> FactType {
    let words = lower_words(line);
    let any = |set: &[&str]| words.iter().any(|w| set.contains(&w.as_str()));
    if any(RELATIONS) {
        FactType::Relationship
    } else if any(PREFERENCES) {
        FactType::Preference
    } else if any(PROJECTS) {
        FactType::Project
    } else {
        FactType::Profile
    }
}

/// Lines no fact has the shape of: under three words ("Luca will."), or still a transcript
/// line of someone other than the speaker ("Sheffield: …").
fn shape_reason(line: &str, speaker: &str) -> Option<Reason> {
    if line.split_whitespace().count() < 3 {
        return Some(Reason::TooShort);
    }
    match line.split_once(':') {
        Some((who, _)) if who.split_whitespace().count() <= 3 && !same_name(who, speaker) => {
            Some(Reason::Subject)
        }
        _ => None,
    }
}

/// The issue's stricter rules over a fact that passed seed 002's: no content word outside
/// the message (the subject and the rewrite's linking verbs aside), and no negation lost.
fn strict_reason(fact: &str, subject: &str, source: &str) -> Option<Reason> {
    let extra: Vec<String> = ungrounded_words(fact, source)
        .into_iter()
        .filter(|w| !LINKING.contains(&w.as_str()) && !same_name(w, subject))
        .collect();
    if !extra.is_empty() {
        return Some(Reason::Ungrounded);
    }
    if !has_negation(fact) && negated_clause_holds(fact, source) {
        return Some(Reason::NegationLost);
    }
    None
}

/// Whether the message clause this fact restates carries a negation: the clause with the
/// most of the fact's words, when it holds at least half of them.
fn negated_clause_holds(fact: &str, message: &str) -> bool {
    let fact_words = lower_words(fact);
    let best = split_clauses(message, NEGATION_JOINS)
        .into_iter()
        .map(|c| {
            let cw = lower_words(&c);
            let hits = fact_words
                .iter()
                .filter(|w| w.len() > 2 && cw.contains(w))
                .count();
            (hits, c)
        })
        .max_by_key(|(h, _)| *h);
    match best {
        Some((hits, clause)) => {
            let long = fact_words.iter().filter(|w| w.len() > 2).count().max(1);
            hits * 2 >= long && has_negation(&clause)
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::store::Kind as MemoryKind;

    const MSG: &str = "My sister Priya lives in Lisbon and works as a nurse.";

    #[test]
    fn lines_keep_grounded_facts_about_named_people() {
        let raw = "- Sam's sister is Priya.\n- Priya lives in Lisbon.\n- Priya works as a nurse in Madrid.\n- I have a sister.\n- Maria is a nurse.\n- She lives in Lisbon.\n- Priya lives in Lisbon.\n";
        let ex = postprocess(raw, "Sam", MSG, false);
        let texts: Vec<&str> = ex.facts.iter().map(|f| f.text.as_str()).collect();
        // "I have a sister" is the speaker's, in the third person.
        assert_eq!(
            texts,
            [
                "Sam's sister is Priya.",
                "Priya lives in Lisbon.",
                "Sam has a sister."
            ]
        );
        assert_eq!(ex.facts[0].fact_type, FactType::Relationship);
        assert_eq!(ex.facts[0].kind, MemoryKind::People);
        assert_eq!(ex.facts[0].entity_refs, ["person:priya"]);
        assert_eq!(ex.facts[0].entity_label, None, "about Sam, naming Priya");
        assert_eq!(ex.facts[1].entity_label.as_deref(), Some("Priya"));
        assert_eq!(ex.facts[1].entity_refs, ["person:priya"]);
        assert_eq!(
            ex.rejected.ungrounded, 2,
            "Madrid, Maria: {:?}",
            ex.rejected
        );
        assert_eq!(ex.rejected.subject, 1, "she: whom?");
        assert_eq!(ex.rejected.duplicate, 1);
    }

    #[test]
    fn a_lost_negation_is_rejected_and_a_kept_one_stays() {
        let msg = "I love my job but I don't drink coffee after 3pm anymore.";
        let ex = postprocess(
            "- Jonas drinks coffee after 3pm.\n- Jonas does not drink coffee after 3pm.\n- Jonas loves his job.\n",
            "Jonas",
            msg,
            false,
        );
        let texts: Vec<&str> = ex.facts.iter().map(|f| f.text.as_str()).collect();
        assert_eq!(
            texts,
            [
                "Jonas does not drink coffee after 3pm.",
                "Jonas loves his job."
            ]
        );
        assert_eq!(ex.rejected.negation_lost, 1);
        assert_eq!(ex.facts[1].fact_type, FactType::Preference);
    }

    #[test]
    fn at_most_four_facts() {
        let msg = "I like tea, coffee, cocoa, juice and milk.";
        let raw: String = ["tea", "coffee", "cocoa", "juice", "milk"]
            .map(|d| format!("- Al likes {d}.\n"))
            .concat();
        let ex = postprocess(&raw, "Al", msg, false);
        assert_eq!(ex.facts.len(), MAX_FACTS);
        assert_eq!(ex.rejected.over_cap, 1);
        assert!(postprocess("", "Al", msg, false).facts.is_empty());
    }
}
