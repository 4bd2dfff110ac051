//! Seed 001's todos: commitments, habits, threads and frictions, found in the user's
//! messages by the same ingest job that extracts memories, and scoped to the character
//! they were said to ("I'll go for a walk tomorrow" is a promise to one character).
//!
//! Detection is a cue grammar over first-person clauses, not the extraction model: a todo
//! is stored in the user's own words, so it is grounded by construction, and a 135M model
//! invents open loops where there are none. A later message that completes or cancels one
//! ("I did the walk", "I'm not going to call her") closes the open todo its words match,
//! with that message as provenance.

mod cues;
mod detect;
mod kinds;
mod store;

pub use detect::{close_score, closings, detect, due_date};
pub use kinds::{Close, Found, TodoKind, MAX_PER_MESSAGE};
pub use store::{apply, list, Applied, Todo};

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::NaiveDate;
    use chrono::{DateTime, TimeZone, Utc};

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
