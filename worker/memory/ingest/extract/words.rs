//! Word lists and text helpers the extraction rules share: which words link a rewrite,
//! name a relation, a liking or a project, and how a message is cut into clauses.

/// Words a third-person rewrite adds that the message need not hold.
pub(super) const LINKING: &[&str] = &[
    "live", "lives", "work", "works", "named", "called", "name", "likes", "like", "loves",
    "enjoys", "wants", "plans", "used", "owns", "got", "gets", "goes", "said", "says", "started",
];

pub(super) const RELATIONS: &[&str] = &[
    "sister",
    "brother",
    "mom",
    "mum",
    "mother",
    "dad",
    "father",
    "wife",
    "husband",
    "partner",
    "girlfriend",
    "boyfriend",
    "son",
    "daughter",
    "kid",
    "kids",
    "friend",
    "coworker",
    "colleague",
    "boss",
    "manager",
    "roommate",
    "flatmate",
    "cousin",
    "aunt",
    "uncle",
    "grandma",
    "grandmother",
    "grandpa",
    "grandfather",
    "fiance",
    "fiancee",
    "neighbour",
    "neighbor",
    "niece",
    "nephew",
    "parents",
    "family",
    "married",
    "grandson",
    "granddaughter",
    "grandkid",
    "stepson",
    "stepdaughter",
    "stepmom",
    "stepdad",
    "bestie",
    "housemate",
    "teammate",
    "classmate",
    "ex",
    "dog",
    "cat",
    "puppy",
    "kitten",
];
pub(super) const PREFERENCES: &[&str] = &[
    "like",
    "likes",
    "love",
    "loves",
    "hate",
    "hates",
    "enjoy",
    "enjoys",
    "prefer",
    "prefers",
    "favourite",
    "favorite",
    "allergic",
    "fan",
    "dislike",
    "dislikes",
    "vegetarian",
    "vegan",
];
pub(super) const PROJECTS: &[&str] = &[
    "building",
    "project",
    "app",
    "startup",
    "writing",
    "developing",
    "launch",
    "launching",
    "thesis",
    "novel",
    "studying",
    "training",
];

/// Words that follow "my sister" without being her name.
pub(super) const COMMON: &[&str] = &[
    "is", "was", "and", "has", "had", "just", "who", "works", "lives", "said", "says", "got",
    "and", "will", "would", "still", "also", "really", "in", "at", "from", "of", "to", "the", "a",
    "an", "are", "were", "does", "did", "can", "cant", "dont", "never", "always", "thinks",
];

pub(super) const ADVERBS: &[&str] = &[
    "just",
    "really",
    "still",
    "also",
    "never",
    "always",
    "usually",
    "mostly",
    "barely",
    "often",
    "sometimes",
    "actually",
    "only",
    "basically",
    "kinda",
    "totally",
    "even",
];

/// Relations that are animals: "my dog rufus" is the speaker's dog named Rufus.
pub(super) const PETS: &[&str] = &["dog", "cat", "puppy", "kitten"];

/// Where a negation's clause ends: "I love my job but I don't drink coffee" is two.
pub(super) const NEGATION_JOINS: &[&str] = &["but", "and", "though", "although"];
/// Where a statement's clause ends, for reading first-person clauses off a message;
/// "and" stays inside ("works nights and sleeps days" is one person's).
pub(super) const CLAUSE_JOINS: &[&str] = &["but", "so", "tho", "though"];

/// The message cut into clauses at punctuation and at the joining words `at`.
pub(super) fn split_clauses(text: &str, at: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for part in text.split(['.', ',', ';', '!', '?', '\n']) {
        let mut cur: Vec<&str> = Vec::new();
        for w in part.split_whitespace() {
            if at.contains(&w.to_lowercase().as_str()) {
                out.push(cur.join(" "));
                cur.clear();
            } else {
                cur.push(w);
            }
        }
        out.push(cur.join(" "));
    }
    out.retain(|c| !c.trim().is_empty());
    out
}

pub(super) fn lower_words(s: &str) -> Vec<String> {
    s.replace(['\'', '’'], "")
        .to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

/// Capitalised words of the fact, possessives stripped, in order.
pub(super) fn names_in(fact: &str) -> Vec<String> {
    fact.split(|c: char| !(c.is_alphanumeric() || c == '\''))
        .map(|w| w.trim_end_matches("'s").trim_matches('\''))
        .filter(|w| w.chars().next().is_some_and(char::is_uppercase))
        .map(str::to_string)
        .collect()
}

/// The message holds `name` as a whole word, any case.
pub(super) fn mentions(message: &str, name: &str) -> bool {
    lower_words(message).contains(&name.to_lowercase())
}

/// Two names are the same person's when their first words match, any case.
pub(super) fn same_name(a: &str, b: &str) -> bool {
    let first = |s: &str| s.split_whitespace().next().unwrap_or("").to_lowercase();
    !a.trim().is_empty() && first(a) == first(b)
}

pub(super) fn capitalised(w: &str) -> String {
    let mut c = w.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}
