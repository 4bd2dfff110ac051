//! Temporal expressions in a query ("last May", "two weeks ago", "in 2023", "yesterday")
//! resolved to a time window relative to a reference time, because questions about the
//! past name a time that the words of the answer never contain.

use chrono::{DateTime, Datelike, Duration, NaiveDate, TimeZone, Utc, Weekday};
use serde::Serialize;

/// A half-open window [start, end) and the phrase it came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TimeWindow {
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub phrase: String,
}

impl TimeWindow {
    pub fn contains(&self, t: DateTime<Utc>) -> bool {
        t >= self.start && t < self.end
    }
}

const MONTHS: [&str; 12] = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
];

fn month_of(w: &str) -> Option<u32> {
    if let Some(i) = MONTHS.iter().position(|m| *m == w) {
        return Some(i as u32 + 1);
    }
    const SHORT: [&str; 12] = [
        "jan", "feb", "", "apr", "", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ];
    if w == "sept" {
        return Some(9);
    }
    SHORT
        .iter()
        .position(|m| !m.is_empty() && *m == w)
        .map(|i| i as u32 + 1)
}

fn weekday_of(w: &str) -> Option<Weekday> {
    Some(match w {
        "monday" => Weekday::Mon,
        "tuesday" => Weekday::Tue,
        "wednesday" => Weekday::Wed,
        "thursday" => Weekday::Thu,
        "friday" => Weekday::Fri,
        "saturday" => Weekday::Sat,
        "sunday" => Weekday::Sun,
        _ => return None,
    })
}

fn number(w: &str) -> Option<i64> {
    if let Ok(n) = w.parse::<i64>() {
        return (1..=100).contains(&n).then_some(n);
    }
    Some(match w {
        "a" | "an" | "one" => 1,
        "two" | "couple" => 2,
        "three" | "few" => 3,
        "four" => 4,
        "five" => 5,
        "six" | "several" => 6,
        "seven" => 7,
        "eight" => 8,
        "nine" => 9,
        "ten" => 10,
        "eleven" => 11,
        "twelve" => 12,
        _ => return None,
    })
}

fn day(d: NaiveDate) -> DateTime<Utc> {
    Utc.from_utc_datetime(&d.and_hms_opt(0, 0, 0).expect("midnight"))
}

fn month_start(y: i32, m: u32) -> DateTime<Utc> {
    day(NaiveDate::from_ymd_opt(y, m, 1).expect("valid month"))
}

fn next_month(y: i32, m: u32) -> (i32, u32) {
    if m == 12 {
        (y + 1, 1)
    } else {
        (y, m + 1)
    }
}

fn month_window(y: i32, m: u32, phrase: String) -> TimeWindow {
    let (ny, nm) = next_month(y, m);
    TimeWindow {
        start: month_start(y, m),
        end: month_start(ny, nm),
        phrase,
    }
}

/// Finds the first temporal expression in `query` and resolves it against `now` (the
/// `--as-of` time, or the newest message of the user's history).
pub fn parse(query: &str, now: DateTime<Utc>) -> Option<TimeWindow> {
    let q = Query::new(query, now);
    for i in 0..q.words.len() {
        match q.step(i) {
            Step::Window(found) => return Some(found),
            Step::Stop => return None,
            Step::Pass => {}
        }
    }
    None
}

/// What one word of the query decides.
enum Step {
    /// The expression starting (or ending) here, resolved.
    Window(TimeWindow),
    /// An "N units ago" without a readable N: the query names no window at all.
    Stop,
    /// Nothing here; on to the next word.
    Pass,
}

/// The query's words, lowercased and as written, and the times they resolve against.
struct Query<'q> {
    words: Vec<String>,
    raw: Vec<&'q str>,
    now: DateTime<Utc>,
    today: DateTime<Utc>,
}

impl<'q> Query<'q> {
    fn new(query: &'q str, now: DateTime<Utc>) -> Query<'q> {
        let words: Vec<String> = query
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .map(|w| w.to_lowercase())
            .collect();
        let raw: Vec<&str> = query
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .collect();
        Query {
            words,
            raw,
            now,
            today: day(now.date_naive()),
        }
    }

    fn w(&self, i: usize) -> &str {
        self.words.get(i).map(String::as_str).unwrap_or("")
    }

    /// The words from the one before `i` to `n` words from `i`: the phrase a window names.
    fn phrase(&self, i: usize, n: usize) -> String {
        self.words[i.saturating_sub(1)..(i + n).min(self.words.len())].join(" ")
    }

    /// Every rule, in order, on the word at `i`.
    fn step(&self, i: usize) -> Step {
        let cur = self.w(i);
        let prev = if i > 0 { self.w(i - 1) } else { "" };
        match cur {
            "yesterday" | "today" | "tonight" | "recently" | "lately" => {
                return Step::Window(self.named_day(cur))
            }
            "ago" if i >= 2 => return self.ago(i),
            "week" | "month" | "year" | "weekend"
                if prev == "last" || prev == "this" || prev == "past" =>
            {
                let (start, end) = self.calendar_unit(cur, prev);
                return Step::Window(TimeWindow {
                    start,
                    end,
                    phrase: self.phrase(i, 1),
                });
            }
            "summer" | "winter" | "spring" | "autumn" | "fall"
                if prev == "last" || prev == "this" =>
            {
                if let Some(found) = self.season(i, cur, prev) {
                    return Step::Window(found);
                }
            }
            _ => {}
        }
        if let Some(wd) = weekday_of(cur) {
            if matches!(prev, "last" | "on" | "this" | "past") {
                return Step::Window(self.weekday(i, wd));
            }
        }
        if let Some(m) = month_of(cur) {
            return match self.month(i, m) {
                Some(found) => Step::Window(found),
                None => Step::Pass,
            };
        }
        match self.year(i) {
            Some(found) => Step::Window(found),
            None => Step::Pass,
        }
    }

    /// "yesterday", "today", "tonight", "recently", "lately".
    fn named_day(&self, cur: &str) -> TimeWindow {
        let today = self.today;
        let (start, end) = match cur {
            "yesterday" => (today - Duration::days(1), today),
            "today" | "tonight" => (today, today + Duration::days(1)),
            _ => (today - Duration::days(30), today + Duration::days(1)),
        };
        TimeWindow {
            start,
            end,
            phrase: cur.into(),
        }
    }

    /// "N units ago", `i` at "ago".
    fn ago(&self, i: usize) -> Step {
        let unit = self.w(i - 1);
        let Some(n) =
            number(self.w(i - 2)).or_else(|| (i >= 3).then(|| number(self.w(i - 3))).flatten())
        else {
            return Step::Stop;
        };
        let days = match unit.trim_end_matches('s') {
            "day" => 1,
            "week" => 7,
            "month" => 30,
            "year" => 365,
            _ => return Step::Pass,
        };
        let centre = self.now - Duration::days(n * days);
        // A fuzzy "N units ago": half a unit either side, at least two days.
        let slack = Duration::days((days / 2).max(2));
        Step::Window(TimeWindow {
            start: centre - slack,
            end: centre + slack,
            phrase: format!("{} {} ago", self.w(i - 2), unit),
        })
    }

    /// "last/this/past week, month, year, weekend": the window's start and end.
    fn calendar_unit(&self, cur: &str, prev: &str) -> (DateTime<Utc>, DateTime<Utc>) {
        let (now, today) = (self.now, self.today);
        let last = prev != "this";
        match cur {
            "week" => {
                let monday = today - Duration::days(now.weekday().num_days_from_monday() as i64);
                if prev == "past" {
                    (today - Duration::days(7), today + Duration::days(1))
                } else if last {
                    (monday - Duration::days(7), monday)
                } else {
                    (monday, monday + Duration::days(7))
                }
            }
            "weekend" => {
                let back = (now.weekday().num_days_from_monday() as i64 + 2) % 7;
                let sat = today - Duration::days(if back == 0 { 7 } else { back });
                (sat, sat + Duration::days(2))
            }
            "month" => {
                let (y, m) = (now.year(), now.month());
                if prev == "past" {
                    (today - Duration::days(30), today + Duration::days(1))
                } else if last {
                    let (py, pm) = if m == 1 { (y - 1, 12) } else { (y, m - 1) };
                    (month_start(py, pm), month_start(y, m))
                } else {
                    let (ny, nm) = next_month(y, m);
                    (month_start(y, m), month_start(ny, nm))
                }
            }
            _ => {
                let y = now.year();
                if prev == "past" {
                    (today - Duration::days(365), today + Duration::days(1))
                } else if last {
                    (month_start(y - 1, 1), month_start(y, 1))
                } else {
                    (month_start(y, 1), month_start(y + 1, 1))
                }
            }
        }
    }

    /// "last/this summer, winter, spring, autumn, fall".
    fn season(&self, i: usize, cur: &str, prev: &str) -> Option<TimeWindow> {
        let now = self.now;
        let (m0, len) = match cur {
            "spring" => (3, 3),
            "summer" => (6, 3),
            "autumn" | "fall" => (9, 3),
            _ => (12, 3),
        };
        let mut y = now.year();
        // The most recent season that has started (and, for "last", ended).
        loop {
            let start = month_start(y, m0);
            let mut end = start;
            for _ in 0..len {
                end = {
                    let (ny, nm) = next_month(end.year(), end.month());
                    month_start(ny, nm)
                };
            }
            let ok = if prev == "last" {
                end <= now
            } else {
                start <= now
            };
            if ok {
                return Some(TimeWindow {
                    start,
                    end,
                    phrase: self.phrase(i, 1),
                });
            }
            y -= 1;
            if y < now.year() - 2 {
                return None;
            }
        }
    }

    /// "last/on/this/past Monday": the most recent one before today.
    fn weekday(&self, i: usize, wd: Weekday) -> TimeWindow {
        let back = (self.now.weekday().num_days_from_monday() as i64
            - wd.num_days_from_monday() as i64
            + 7)
            % 7;
        let back = if back == 0 { 7 } else { back };
        let d = self.today - Duration::days(back);
        TimeWindow {
            start: d,
            end: d + Duration::days(1),
            phrase: self.phrase(i, 1),
        }
    }

    /// A month name, `m`, at `i`, with or without a year after it.
    fn month(&self, i: usize, m: u32) -> Option<TimeWindow> {
        let (cur, now) = (self.w(i), self.now);
        let prev = if i > 0 { self.w(i - 1) } else { "" };
        // "may" and "march" are also ordinary words: only a capitalised one or one in
        // a time phrase counts.
        let ambiguous = cur == "may" || cur == "march";
        let timey = matches!(
            prev,
            "last"
                | "in"
                | "of"
                | "since"
                | "during"
                | "early"
                | "mid"
                | "late"
                | "this"
                | "until"
                | "before"
                | "after"
        ) || self.w(i + 1).parse::<i32>().is_ok();
        let capital = self
            .raw
            .get(i)
            .is_some_and(|r| r.chars().next().is_some_and(char::is_uppercase))
            && i > 0;
        if ambiguous && !(timey || capital) {
            return None;
        }
        let year = self
            .w(i + 1)
            .parse::<i32>()
            .ok()
            .filter(|y| (1900..=2200).contains(y));
        let y = match year {
            Some(y) => y,
            None => {
                // The most recent such month before now; "last May" in May means a year ago.
                let mut y = now.year();
                if m > now.month() || (m == now.month() && prev == "last") {
                    y -= 1;
                }
                y
            }
        };
        Some(month_window(
            y,
            m,
            self.phrase(i, if year.is_some() { 2 } else { 1 }),
        ))
    }

    /// "in 2023", "during 2019", …: a four-digit year after a time word.
    fn year(&self, i: usize) -> Option<TimeWindow> {
        let cur = self.w(i);
        let prev = if i > 0 { self.w(i - 1) } else { "" };
        if cur.len() != 4 || !matches!(prev, "in" | "of" | "during" | "since" | "year") {
            return None;
        }
        let y = cur
            .parse::<i32>()
            .ok()
            .filter(|y| (1900..=2200).contains(y))?;
        Some(TimeWindow {
            start: month_start(y, 1),
            end: month_start(y + 1, 1),
            phrase: self.phrase(i, 1),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn resolves_common_phrases() {
        let now = at("2024-06-12T10:00:00Z"); // a Wednesday
                                              // The most recent May before the current month.
        let w = parse("What did Jo do last May?", now).unwrap();
        assert_eq!(
            (w.start, w.end),
            (at("2024-05-01T00:00:00Z"), at("2024-06-01T00:00:00Z"))
        );
        let w = parse("What did Jo do last June?", now).unwrap();
        assert_eq!(w.start, at("2023-06-01T00:00:00Z"));
        let w = parse("anything in May?", now).unwrap();
        assert_eq!(w.start, at("2024-05-01T00:00:00Z"));
        let w = parse("plans for March 2022", now).unwrap();
        assert_eq!(w.start, at("2022-03-01T00:00:00Z"));
        let w = parse("what happened yesterday", now).unwrap();
        assert_eq!(w.start, at("2024-06-11T00:00:00Z"));
        let w = parse("two weeks ago we talked", now).unwrap();
        assert!(w.contains(at("2024-05-29T12:00:00Z")));
        let w = parse("last week", now).unwrap();
        assert_eq!(
            (w.start, w.end),
            (at("2024-06-03T00:00:00Z"), at("2024-06-10T00:00:00Z"))
        );
        let w = parse("last Friday", now).unwrap();
        assert_eq!(w.start, at("2024-06-07T00:00:00Z"));
        let w = parse("what did we do in 2023", now).unwrap();
        assert_eq!(w.end, at("2024-01-01T00:00:00Z"));
        assert!(parse("may I ask what you like", now).is_none());
        assert!(parse("where does Sam work", now).is_none());
    }
}
