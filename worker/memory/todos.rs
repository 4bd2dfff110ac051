//! Seed 001's todos: commitments, habits, threads and frictions, found in the user's
//! messages by the same ingest job that extracts memories, and scoped to the character
//! they were said to ("I'll go for a walk tomorrow" is a promise to one character).
//!
//! Detection is a cue grammar over first-person clauses, not the extraction model: a todo
//! is stored in the user's own words, so it is grounded by construction, and a 135M model
//! invents open loops where there are none. A later message that completes or cancels one
//! ("I did the walk", "I'm not going to call her") closes the open todo its words match,
//! with that message as provenance.

use chrono::{DateTime, Datelike, Duration, NaiveDate, Utc, Weekday};
use serde::Serialize;
use sqlx::{PgPool, Row};

use super::filters::{check_fact, dedup_key, Verdict};
use super::search::{content_words, stem};
use super::Result;

/// Seed 001's four kinds of open loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TodoKind {
    Commitment,
    Habit,
    Thread,
    Friction,
}

impl TodoKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TodoKind::Commitment => "commitment",
            TodoKind::Habit => "habit",
            TodoKind::Thread => "thread",
            TodoKind::Friction => "friction",
        }
    }
}

/// A todo found in a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub kind: TodoKind,
    /// The clause, as the user wrote it.
    pub text: String,
    pub due: Option<NaiveDate>,
}

/// How a closing clause ends a todo.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Close {
    Done,
    Dropped,
}

impl Close {
    pub fn as_str(self) -> &'static str {
        match self {
            Close::Done => "done",
            Close::Dropped => "dropped",
        }
    }
}

/// At most this many todos come from one message.
pub const MAX_PER_MESSAGE: usize = 3;
/// A todo's text is a clause, cut at this many characters.
const MAX_TEXT_CHARS: usize = 160;
/// A closing clause must share this share of an open todo's content words...
const CLOSE_SHARE: f64 = 0.5;
/// ...and at least one word.
const CLOSE_MIN_SHARED: usize = 1;

// Cue tables, checked on the lowercased clause start. Order of kinds matters: "I keep
// forgetting to call" is a friction, "I need to decide" a thread, before either could be
// read as a commitment.
const FRICTION: &[&str] = &[
    "i keep ",
    "i struggle ",
    "i'm struggling ",
    "i am struggling ",
    "i can't seem to ",
    "i never manage to ",
    "i always forget ",
    "it's hard for me to ",
    "i'm having trouble ",
    "i have trouble ",
];
const THREAD: &[&str] = &[
    "i'm waiting for ",
    "i am waiting for ",
    "i'm still waiting ",
    "i haven't decided ",
    "i can't decide ",
    "i need to decide ",
    "i'm trying to figure out ",
    "i'm not sure whether ",
    "i'm not sure if ",
    "i still haven't heard ",
    "i'm thinking about ",
    "i'm considering ",
];
const HABIT: &[&str] = &[
    "i usually ",
    "i always ",
    "i tend to ",
    "i've started ",
    "i have started ",
    "i'm trying to ",
];
/// A habit needs one of these in its clause as well ("I always forget" is not a habit;
/// "I run every morning" is, with no cue but the frequency).
const FREQUENCY: &[&str] = &[
    "every day",
    "every morning",
    "every night",
    "every evening",
    "every week",
    "every weekend",
    "each morning",
    "each day",
    "each week",
    "daily",
    "twice a week",
    "three times a week",
    "on weekdays",
    "most mornings",
    "most days",
];
const COMMITMENT: &[&str] = &[
    "i'll ",
    "i will ",
    "i'm going to ",
    "i am going to ",
    "im going to ",
    "i'm gonna ",
    "i promise to ",
    "i plan to ",
    "i'm planning to ",
    "i intend to ",
    "i need to ",
    "i have to ",
    "i've got to ",
    "i must ",
];
/// "I'll be honest" and the like are not promises.
const NOT_PROMISES: &[&str] = &[
    "be honest",
    "be fine",
    "be ok",
    "be okay",
    "be right back",
    "admit",
    "never",
    "not ",
    "try",
    "see",
];
const DONE: &[&str] = &[
    "i did ",
    "i did it",
    "i went ",
    "i finished ",
    "i've finished ",
    "i have finished ",
    "i completed ",
    "i've done ",
    "i have done ",
    "i managed to ",
    "i finally ",
    "i already ",
    "i got ",
    "i made ",
    "i called ",
    "i sent ",
    "i booked ",
    "i bought ",
    "i wrote ",
    "i ran ",
    "i walked ",
    "i took ",
    "done with ",
];
const DROPPED: &[&str] = &[
    "i won't ",
    "i will not ",
    "i'm not going to ",
    "i am not going to ",
    "im not going to ",
    "i decided not to ",
    "i've decided not to ",
    "i gave up ",
    "i've given up ",
    "i'm giving up ",
    "never mind ",
    "i cancelled ",
    "i canceled ",
    "i skipped ",
    "i'm skipping ",
    "i don't need to ",
    "i no longer ",
];
/// Words that date a todo, not say what it is: they never decide a match.
const TIME_WORDS: &[&str] = &[
    "today",
    "tonight",
    "tomorrow",
    "yesterday",
    "week",
    "weekend",
    "month",
    "morning",
    "evening",
    "afternoon",
    "night",
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
    "next",
    "later",
    "soon",
];

/// Openers a clause may start with before its cue ("ok so I'll …", "and I keep …").
const LEAD_INS: &[&str] = &[
    "so ", "ok ", "okay ", "and ", "but ", "well ", "also ", "then ",
];

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

/// A stored todo.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Todo {
    pub id: i64,
    pub user_id: String,
    pub character_id: i64,
    pub kind: String,
    pub text: String,
    pub status: String,
    pub due_date: Option<NaiveDate>,
    pub source_message_ids: Vec<String>,
    pub closed_by_message_id: Option<String>,
    pub closed_evidence: Option<String>,
    pub created_at: DateTime<Utc>,
    pub closed_at: Option<DateTime<Utc>>,
}

/// What one message did to its character's todos.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Applied {
    pub created: Vec<i64>,
    pub closed: Vec<i64>,
    /// Clauses that looked like todos but failed the filters (injection, grounding).
    pub rejected: u32,
}

/// One message of the user's to the character: closes the open todos it completes or
/// cancels, then records the ones it makes. One transaction; safe to run again for the
/// same message (a repeat merges into the open todo and closes nothing twice).
pub async fn apply(
    pool: &PgPool,
    user: &str,
    character: i64,
    message_id: &str,
    message: &str,
    at: DateTime<Utc>,
) -> Result<Applied> {
    let mut applied = Applied::default();
    let closings = closings(message);
    let found = detect(message, at);
    if closings.is_empty() && found.is_empty() {
        return Ok(applied);
    }
    let mut tx = pool.begin().await?;
    if !closings.is_empty() {
        let open = list_in(&mut tx, user, character, true).await?;
        for (how, clause) in closings {
            let best = open
                .iter()
                .filter(|t| !applied.closed.contains(&t.id))
                .filter_map(|t| close_score(&clause, &t.text).map(|s| (s, t)))
                .max_by(|a, b| a.0.total_cmp(&b.0).then(b.1.id.cmp(&a.1.id)));
            let Some((_, todo)) = best else { continue };
            let closed: Option<i64> =
                sqlx::query_scalar(include_str!("../../sql/memory/todo_close.sql"))
                    .bind(todo.id)
                    .bind(user)
                    .bind(character)
                    .bind(how.as_str())
                    .bind(message_id)
                    .bind(&clause)
                    .bind(at)
                    .fetch_optional(&mut *tx)
                    .await?;
            applied.closed.extend(closed);
        }
    }
    for f in found {
        let text = match check_fact(&f.text, "other", None, message) {
            // The filters' normal form ends the clause with a period; a todo is a clause.
            Verdict::Accepted(c) => c.text.trim_end_matches(['.', '!', '?']).to_string(),
            Verdict::Rejected(_) => {
                applied.rejected += 1;
                continue;
            }
        };
        let id: i64 = sqlx::query_scalar(include_str!("../../sql/memory/todo_upsert.sql"))
            .bind(user)
            .bind(character)
            .bind(f.kind.as_str())
            .bind(&text)
            .bind(dedup_key(&text))
            .bind(f.due)
            .bind(message_id)
            .bind(at)
            .fetch_one(&mut *tx)
            .await?;
        applied.created.push(id);
    }
    tx.commit().await?;
    Ok(applied)
}

/// The user's todos with one character, open ones only or all, newest first (open ones
/// due first).
pub async fn list(pool: &PgPool, user: &str, character: i64, open_only: bool) -> Result<Vec<Todo>> {
    let mut conn = pool.acquire().await?;
    list_in(&mut conn, user, character, open_only).await
}

async fn list_in(
    conn: &mut sqlx::PgConnection,
    user: &str,
    character: i64,
    open_only: bool,
) -> Result<Vec<Todo>> {
    let rows = sqlx::query(include_str!("../../sql/memory/todos_list.sql"))
        .bind(user)
        .bind(character)
        .bind(open_only)
        .fetch_all(conn)
        .await?;
    rows.iter()
        .map(|r| {
            Ok(Todo {
                id: r.try_get("id")?,
                user_id: r.try_get("user_id")?,
                character_id: r.try_get("character_id")?,
                kind: r.try_get("kind")?,
                text: r.try_get("text")?,
                status: r.try_get("status")?,
                due_date: r.try_get("due_date")?,
                source_message_ids: r.try_get("source_message_ids")?,
                closed_by_message_id: r.try_get("closed_by_message_id")?,
                closed_evidence: r.try_get("closed_evidence")?,
                created_at: r.try_get("created_at")?,
                closed_at: r.try_get("closed_at")?,
            })
        })
        .collect::<std::result::Result<_, sqlx::Error>>()
        .map_err(Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    // A Tuesday.
    fn at() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 24, 10, 0, 0).unwrap()
    }

    fn kinds(message: &str) -> Vec<(TodoKind, String)> {
        detect(message, at())
            .into_iter()
            .map(|f| (f.kind, f.text))
            .collect()
    }

    #[test]
    fn the_four_kinds_are_found_in_the_users_words() {
        assert_eq!(
            kinds("Ok so I'll go for a walk tomorrow. I keep forgetting to drink water!"),
            vec![
                (TodoKind::Commitment, "I'll go for a walk tomorrow".into()),
                (
                    TodoKind::Friction,
                    "I keep forgetting to drink water".into()
                ),
            ]
        );
        assert_eq!(
            kinds("I run every morning before work, and I'm waiting for the visa letter"),
            vec![
                (TodoKind::Habit, "I run every morning before work".into()),
                (TodoKind::Thread, "I'm waiting for the visa letter".into()),
            ]
        );
    }

    #[test]
    fn look_alikes_are_not_todos() {
        for m in [
            "I'll be honest, it was fine.",
            "I will not go.",
            "She'll go for a walk tomorrow.",
            "I'll try.",
            "I went for a walk.",
            "Do you think I'll like it?",
        ] {
            assert_eq!(kinds(m), vec![], "{m}");
        }
    }

    #[test]
    fn due_dates_come_from_the_text() {
        let due = |m: &str| detect(m, at()).first().and_then(|f| f.due);
        let d = |y, m, dd| NaiveDate::from_ymd_opt(y, m, dd);
        assert_eq!(due("I'll call mum tomorrow"), d(2026, 11, 25));
        assert_eq!(due("I'm going to fix the bike on Friday"), d(2026, 11, 27));
        assert_eq!(due("I need to renew it on Tuesday"), d(2026, 12, 1));
        assert_eq!(due("I have to submit it by 2026-12-03"), d(2026, 12, 3));
        assert_eq!(due("I'll send it in three days"), d(2026, 11, 27));
        assert_eq!(due("I'll paint the fence"), None);
    }

    #[test]
    fn closing_clauses_match_the_todo_they_name() {
        let walk = "I'll go for a walk tomorrow";
        let c = closings("Guess what, I did the walk! It was lovely.");
        assert_eq!(c, vec![(Close::Done, "I did the walk".to_string())]);
        assert!(close_score(&c[0].1, walk).is_some());
        assert!(close_score("I went walking by the river", walk).is_some());
        assert!(close_score("I called my sister", walk).is_none());
        let d = closings("never mind the walk, I'm not going to bother");
        assert_eq!(d[0].0, Close::Dropped);
        assert!(close_score(&d[0].1, walk).is_some());
        // A closing clause is never also a new todo.
        assert_eq!(kinds("I won't go for a walk tomorrow"), vec![]);
    }
}
