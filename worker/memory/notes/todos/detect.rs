//! Finding todos and closings in a message: clauses split out, read from their
//! first-person start, matched against the cue tables; and the day a clause names.

use chrono::{DateTime, Datelike, Duration, NaiveDate, Utc, Weekday};

use crate::memory::search::{content_words, stem};
use crate::memory::store::filters::dedup_key;

use super::cues::{
    COMMITMENT, DONE, DROPPED, FREQUENCY, FRICTION, HABIT, LEAD_INS, NOT_PROMISES, THREAD,
    TIME_WORDS,
};
use super::kinds::{
    Close, Found, TodoKind, CLOSE_MIN_SHARED, CLOSE_SHARE, MAX_PER_MESSAGE, MAX_TEXT_CHARS,
};

/// The message's clauses: sentences, split again at commas ("Guess what, I did the
/// walk"; "I run daily, and I keep getting shin splints").
fn clauses(message: &str) -> Vec<&str> {
    message
        .split(['.', '!', '?', ';', ',', '\n'])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

/// The clause from its first-person start, lead-ins dropped; and its lowercase form.
fn first_person(clause: &str) -> (&str, String) {
    let mut c = clause;
    loop {
        let lower = c.to_lowercase();
        match LEAD_INS.iter().find(|l| lower.starts_with(*l)) {
            Some(l) => c = c[l.len()..].trim_start_matches([',', ' ']),
            None => return (c, normalise_apostrophes(&lower)),
        }
    }
}

fn normalise_apostrophes(s: &str) -> String {
    s.replace('’', "'")
}

fn starts_with_any(lower: &str, cues: &[&str]) -> Option<usize> {
    cues.iter().find(|c| lower.starts_with(*c)).map(|c| c.len())
}

/// Todos in one user message said at `at`, at most [`MAX_PER_MESSAGE`].
pub fn detect(message: &str, at: DateTime<Utc>) -> Vec<Found> {
    let mut out: Vec<Found> = Vec::new();
    for clause in clauses(message) {
        let (clause, lower) = first_person(clause);
        if closing(&lower).is_some() {
            continue;
        }
        let kind = if starts_with_any(&lower, FRICTION).is_some() {
            Some(TodoKind::Friction)
        } else if starts_with_any(&lower, THREAD).is_some() {
            Some(TodoKind::Thread)
        } else if lower.starts_with("i ") && FREQUENCY.iter().any(|f| lower.contains(f))
            || starts_with_any(&lower, HABIT).is_some()
                && FREQUENCY.iter().any(|f| lower.contains(f))
        {
            Some(TodoKind::Habit)
        } else if let Some(n) = starts_with_any(&lower, COMMITMENT) {
            let rest = &lower[n..];
            let words = rest.split_whitespace().count();
            (words >= 2 && !NOT_PROMISES.iter().any(|p| rest.starts_with(p)))
                .then_some(TodoKind::Commitment)
        } else {
            None
        };
        let Some(kind) = kind else { continue };
        let text: String = clause.chars().take(MAX_TEXT_CHARS).collect();
        if out.iter().any(|f| dedup_key(&f.text) == dedup_key(&text)) {
            continue;
        }
        out.push(Found {
            kind,
            due: due_date(&lower, at),
            text,
        });
        if out.len() == MAX_PER_MESSAGE {
            break;
        }
    }
    out
}

/// Whether a (lowercase, first-person) clause completes or cancels something.
fn closing(lower: &str) -> Option<Close> {
    if starts_with_any(lower, DROPPED).is_some() {
        Some(Close::Dropped)
    } else if starts_with_any(lower, DONE).is_some() {
        Some(Close::Done)
    } else {
        None
    }
}

/// The closing clauses of a message: how each ends a todo, and its words.
pub fn closings(message: &str) -> Vec<(Close, String)> {
    clauses(message)
        .into_iter()
        .filter_map(|c| {
            let (clause, lower) = first_person(c);
            closing(&lower).map(|how| (how, clause.to_string()))
        })
        .collect()
}

fn topic_words(text: &str) -> Vec<String> {
    let mut words: Vec<String> = content_words(text)
        .into_iter()
        .filter(|w| w.chars().count() >= 3 && !TIME_WORDS.contains(&w.as_str()))
        .map(|w| stem(&w).to_string())
        .collect();
    words.sort();
    words.dedup();
    words
}

/// How well a closing clause matches an open todo: the share of the todo's topic words it
/// says, or `None` below the bar.
pub fn close_score(clause: &str, todo: &str) -> Option<f64> {
    let todo_words = topic_words(todo);
    if todo_words.is_empty() {
        return None;
    }
    let said = topic_words(clause);
    let shared = todo_words.iter().filter(|w| said.contains(w)).count();
    let share = shared as f64 / todo_words.len() as f64;
    (shared >= CLOSE_MIN_SHARED && share >= CLOSE_SHARE).then_some(share)
}

/// The day a clause names, relative to `at`.
pub fn due_date(lower: &str, at: DateTime<Utc>) -> Option<NaiveDate> {
    let today = at.date_naive();
    let has = |w: &str| {
        lower
            .split(|c: char| !c.is_alphanumeric() && c != '-')
            .any(|x| x == w)
    };
    if let Some(d) = lower
        .split(|c: char| !c.is_ascii_digit() && c != '-')
        .find_map(|w| NaiveDate::parse_from_str(w, "%Y-%m-%d").ok())
    {
        return Some(d);
    }
    if has("tomorrow") {
        return Some(today + Duration::days(1));
    }
    if has("today") || has("tonight") || lower.contains("this evening") {
        return Some(today);
    }
    if lower.contains("next week") {
        return Some(today + Duration::days(7));
    }
    if lower.contains("this weekend") {
        return Some(next_weekday(today, Weekday::Sat));
    }
    const DAYS: [(&str, Weekday); 7] = [
        ("monday", Weekday::Mon),
        ("tuesday", Weekday::Tue),
        ("wednesday", Weekday::Wed),
        ("thursday", Weekday::Thu),
        ("friday", Weekday::Fri),
        ("saturday", Weekday::Sat),
        ("sunday", Weekday::Sun),
    ];
    if let Some((_, wd)) = DAYS.iter().find(|(name, _)| has(name)) {
        return Some(next_weekday(today, *wd));
    }
    let words: Vec<&str> = lower.split_whitespace().collect();
    words.windows(3).find_map(|w| {
        let n = match w[1] {
            "one" | "a" => 1,
            "two" => 2,
            "three" => 3,
            "four" => 4,
            "five" => 5,
            n => n.parse().ok()?,
        };
        (w[0] == "in" && w[2].starts_with("day") && (1..=365).contains(&n))
            .then(|| today + Duration::days(n))
    })
}

/// The next `wd` after `today` (a week on when today is `wd`).
fn next_weekday(today: NaiveDate, wd: Weekday) -> NaiveDate {
    let ahead = (wd.num_days_from_monday() as i64 - today.weekday().num_days_from_monday() as i64)
        .rem_euclid(7);
    today + Duration::days(if ahead == 0 { 7 } else { ahead })
}
