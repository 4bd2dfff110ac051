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
    let words: Vec<String> = query
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| w.to_lowercase())
        .collect();
    let raw: Vec<&str> = query
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    let today = day(now.date_naive());
    let w = |i: usize| words.get(i).map(String::as_str).unwrap_or("");
    for i in 0..words.len() {
        let cur = w(i);
        let prev = if i > 0 { w(i - 1) } else { "" };
        let phrase = |n: usize| words[i.saturating_sub(1)..(i + n).min(words.len())].join(" ");
        match cur {
            "yesterday" => {
                return Some(TimeWindow {
                    start: today - Duration::days(1),
                    end: today,
                    phrase: cur.into(),
                })
            }
            "today" | "tonight" => {
                return Some(TimeWindow {
                    start: today,
                    end: today + Duration::days(1),
                    phrase: cur.into(),
                })
            }
            "recently" | "lately" => {
                return Some(TimeWindow {
                    start: today - Duration::days(30),
                    end: today + Duration::days(1),
                    phrase: cur.into(),
                })
            }
            "ago" if i >= 2 => {
                let unit = w(i - 1);
                let n =
                    number(w(i - 2)).or_else(|| (i >= 3).then(|| number(w(i - 3))).flatten())?;
                let days = match unit.trim_end_matches('s') {
                    "day" => 1,
                    "week" => 7,
                    "month" => 30,
                    "year" => 365,
                    _ => continue,
                };
                let centre = now - Duration::days(n * days);
                // A fuzzy "N units ago": half a unit either side, at least two days.
                let slack = Duration::days((days / 2).max(2));
                return Some(TimeWindow {
                    start: centre - slack,
                    end: centre + slack,
                    phrase: format!("{} {} ago", w(i - 2), unit),
                });
            }
            "week" | "month" | "year" | "weekend"
                if prev == "last" || prev == "this" || prev == "past" =>
            {
                let last = prev != "this";
                let (start, end) = match cur {
                    "week" => {
                        let monday =
                            today - Duration::days(now.weekday().num_days_from_monday() as i64);
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
                };
                return Some(TimeWindow {
                    start,
                    end,
                    phrase: phrase(1),
                });
            }
            "summer" | "winter" | "spring" | "autumn" | "fall"
                if prev == "last" || prev == "this" =>
            {
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
                            phrase: phrase(1),
                        });
                    }
                    y -= 1;
                    if y < now.year() - 2 {
                        break;
                    }
                }
            }
            _ => {}
        }
        if let Some(wd) = weekday_of(cur) {
            if matches!(prev, "last" | "on" | "this" | "past") {
                let back = (now.weekday().num_days_from_monday() as i64
                    - wd.num_days_from_monday() as i64
                    + 7)
                    % 7;
                let back = if back == 0 { 7 } else { back };
                let d = today - Duration::days(back);
                return Some(TimeWindow {
                    start: d,
                    end: d + Duration::days(1),
                    phrase: phrase(1),
                });
            }
        }
        if let Some(m) = month_of(cur) {
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
            ) || w(i + 1).parse::<i32>().is_ok();
            let capital = raw
                .get(i)
                .is_some_and(|r| r.chars().next().is_some_and(char::is_uppercase))
                && i > 0;
            if ambiguous && !(timey || capital) {
                continue;
            }
            let year = w(i + 1)
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
            return Some(month_window(
                y,
                m,
                phrase(if year.is_some() { 2 } else { 1 }),
            ));
        }
        if cur.len() == 4 && matches!(prev, "in" | "of" | "during" | "since" | "year") {
            if let Ok(y) = cur.parse::<i32>() {
                if (1900..=2200).contains(&y) {
                    return Some(TimeWindow {
                        start: month_start(y, 1),
                        end: month_start(y + 1, 1),
                        phrase: phrase(1),
                    });
                }
            }
        }
    }
    None
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
