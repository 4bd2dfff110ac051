//! Seed 004's transient memory: one batch model call per (guild, day) summarises every
//! active user of that day (a direct chat's user alone), a days 2–7 summary is made per
//! user when the day rolls over, and a 3-way merge of facts, current day and history gives
//! the user context, facts winning. Each level is cached (see [`super::cache`]) and stored in Postgres. When the
//! model fails, what exists is returned in priority order and the reason is recorded.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Duration, NaiveDate, NaiveTime, TimeZone, Timelike, Utc};
use serde::Serialize;
use serde_json::json;

use super::cache::{content_hash, record, DayMap, Source};
use super::daily_prompt::batch_grammar;
pub use super::daily_prompt::xml_message;
use super::llm::Prompt;
use super::{clip, event, Result, SummaryError, SummaryService};
use crate::memory::store::filters::is_text_grounded_in_source;

/// Seed 004's sizes, in characters.
pub const DAILY_CHARS: usize = 300;
pub const HISTORICAL_CHARS: usize = 500;
pub const CONTEXT_CHARS: usize = 1200;
/// Messages read for one day at most.
pub const DAY_MESSAGES: i64 = 2000;

/// The merged user context and how it was made.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UserContext {
    pub context: String,
    pub facts: String,
    pub current_day: Option<String>,
    pub historical: Option<String>,
    pub sources: BTreeMap<&'static str, Source>,
    /// Why parts are missing or the merge was skipped (empty = nothing degraded).
    pub degraded: Vec<String>,
}

fn day_start(day: NaiveDate) -> DateTime<Utc> {
    Utc.from_utc_datetime(&day.and_time(NaiveTime::MIN))
}

/// The hour bucket key of the current day: "YYYY-MM-DD-HH".
pub fn hour_bucket(now: DateTime<Utc>) -> String {
    format!("{}-{:02}", now.date_naive(), now.hour())
}

/// The six days of the historical summary (days 2–7): yesterday and the five before it.
pub fn historical_days(now: DateTime<Utc>) -> Vec<NaiveDate> {
    let today = now.date_naive();
    (1..=6).rev().map(|d| today - Duration::days(d)).collect()
}

/// Whose messages one batch call reads. A guild's members talk in shared channels, so seed
/// 004 summarises them in one call; direct chats are private, so each user is a batch of
/// one and no user's words ever reach a prompt that summarises another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// The guild ('' = direct chats).
    pub guild: String,
    /// Set for direct chats: the one user of the batch.
    pub user: Option<String>,
}

impl Batch {
    pub fn of(scope: &str, user: &str) -> Batch {
        Batch {
            guild: scope.to_string(),
            user: scope.is_empty().then(|| user.to_string()),
        }
    }

    /// The cache and storage key: `guild:<id>` or `user:<id>`.
    pub fn key(&self) -> String {
        match &self.user {
            Some(u) => format!("user:{u}"),
            None => format!("guild:{}", self.guild),
        }
    }
}

/// The batch summaries of `day` for `batch`, as of `now`: the current day under its hour
/// bucket (TTL cache), a past day under its date (LRU). Memory, then Postgres, then model.
pub async fn day_summaries(
    svc: &SummaryService,
    batch: &Batch,
    day: NaiveDate,
    now: DateTime<Utc>,
) -> Result<(Arc<DayMap>, Source)> {
    let slot = DaySlot::new(batch, day, now);
    if let Some(m) = slot.cached(svc) {
        record(slot.cache_name(), Source::Memory);
        return Ok((m, Source::Memory));
    }
    let stored: Option<serde_json::Value> =
        sqlx::query_scalar(include_str!("../../sql/summary/daily_get.sql"))
            .bind(&slot.key)
            .bind(day)
            .bind(&slot.bucket)
            .fetch_optional(&svc.pool)
            .await?;
    if let Some(v) = stored {
        let m: Arc<DayMap> = Arc::new(serde_json::from_value(v)?);
        slot.put(svc, m.clone());
        record(slot.cache_name(), Source::Db);
        return Ok((m, Source::Db));
    }
    let end = match slot.current {
        true => now,
        false => day_start(day + Duration::days(1)),
    };
    let (map, elapsed_ms) = batch_summarise(svc, batch, day_start(day), end).await?;
    sqlx::query(include_str!("../../sql/summary/daily_put.sql"))
        .bind(&slot.key)
        .bind(day)
        .bind(&slot.bucket)
        .bind(serde_json::to_value(&map)?)
        .bind(elapsed_ms as i32)
        .execute(&svc.pool)
        .await?;
    let m = Arc::new(map);
    slot.put(svc, m.clone());
    record(slot.cache_name(), Source::Computed);
    Ok((m, Source::Computed))
}

/// Where one day's batch lives: the current day in the TTL cache under its hour bucket, a
/// past day in the LRU under its date; in Postgres under (key, day, "HH" or "day").
struct DaySlot {
    key: String,
    day: NaiveDate,
    current: bool,
    bucket: String,
    hour_key: String,
}

impl DaySlot {
    fn new(batch: &Batch, day: NaiveDate, now: DateTime<Utc>) -> DaySlot {
        let current = day == now.date_naive();
        DaySlot {
            key: batch.key(),
            day,
            current,
            bucket: match current {
                true => format!("{:02}", now.hour()),
                false => "day".into(),
            },
            hour_key: hour_bucket(now),
        }
    }

    fn cache_name(&self) -> &'static str {
        if self.current {
            "current_day"
        } else {
            "past_day"
        }
    }

    fn cached(&self, svc: &SummaryService) -> Option<Arc<DayMap>> {
        match self.current {
            true => svc
                .caches
                .current_day
                .get(&(self.key.clone(), self.hour_key.clone())),
            false => svc.caches.past_days.get(&(self.key.clone(), self.day)),
        }
    }

    fn put(&self, svc: &SummaryService, m: Arc<DayMap>) {
        match self.current {
            true => svc
                .caches
                .current_day
                .insert((self.key.clone(), self.hour_key.clone()), m),
            false => svc.caches.past_days.insert((self.key.clone(), self.day), m),
        }
    }
}

const DAILY_SYSTEM: &str = "You write a daily summary for each listed user from a day of chat \
messages in XML. For each user: notable events or experiences they mentioned, their mood, the \
topics they discussed, behaviour they showed, and what others revealed about them. Third \
person, about 300 characters per user. Answer with a JSON object from user id to summary.";

/// One message of a batch, as `day_messages.sql` returns it.
#[derive(Debug, sqlx::FromRow)]
struct DayMessage {
    user_id: String,
    /// Set on turn messages: the character the user talked to.
    character_id: Option<i64>,
    speaker: String,
    text: String,
    at: DateTime<Utc>,
}

/// The batch's users (in order of first message) and its messages in seed 004's XML.
pub async fn day_lines(
    svc: &SummaryService,
    batch: &Batch,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
) -> Result<(Vec<String>, Vec<String>)> {
    let rows = sqlx::query_as::<_, DayMessage>(include_str!("../../sql/summary/day_messages.sql"))
        .bind(&batch.guild)
        .bind(start)
        .bind(end)
        .bind(DAY_MESSAGES)
        .bind(batch.user.as_deref())
        .fetch_all(&svc.pool)
        .await?;
    let mut users: Vec<String> = Vec::new();
    let mut lines = Vec::new();
    for r in rows {
        let user = r.user_id;
        let (author_id, author) = match r.speaker.as_str() {
            "assistant" => {
                let character = r.character_id.unwrap_or(0);
                (format!("character:{character}"), "character".to_string())
            }
            "user" => (user.clone(), user.clone()),
            name => (user.clone(), name.to_string()),
        };
        if !users.contains(&user) {
            users.push(user);
        }
        lines.push(xml_message(r.at, &author_id, &author, &r.text));
    }
    Ok((users, lines))
}

/// One model call for every active user of the batch in [start, end). No messages, no call.
async fn batch_summarise(
    svc: &SummaryService,
    batch: &Batch,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
) -> Result<(DayMap, u64)> {
    let (users, lines) = day_lines(svc, batch, start, end).await?;
    if users.is_empty() {
        return Ok((DayMap::new(), 0));
    }
    let model = svc.model()?;
    let prompt = Prompt {
        system: DAILY_SYSTEM.into(),
        header: format!("Users: {}\nMessages:", users.join(", ")),
        lines,
        footer: "Daily summaries as JSON:".into(),
        grammar: Some(batch_grammar(&users)),
        max_tokens: svc.config.daily_max_tokens_per_user * users.len() as u32,
    };
    let g = model
        .generate(prompt)
        .await
        .map_err(|e| SummaryError::Model(e.0))?;
    let map: BTreeMap<String, String> = serde_json::from_str(&g.text).map_err(|e| {
        let cut = if g.truncated {
            " (cut off by the token budget)"
        } else {
            ""
        };
        SummaryError::Model(format!(
            "daily batch answer is not the users' JSON{cut}: {e}"
        ))
    })?;
    let map = map
        .into_iter()
        .filter(|(u, _)| users.contains(u))
        .map(|(u, s)| (u, clip(&s, DAILY_CHARS)))
        .collect();
    Ok((map, g.elapsed_ms))
}

const HISTORICAL_SYSTEM: &str = "You write a behavioural summary of one user from their daily \
summaries of the past days: recurring patterns and themes, mood trends, significant events or \
changes, personality shown by consistent behaviour. Third person, about 500 characters, plain \
sentences. Answer with the summary only.";

/// The user's days 2–7 summary, keyed by its end date (yesterday): it changes only when
/// the day rolls over. Memory, then Postgres, then the model; "" when those days are empty.
pub async fn historical(
    svc: &SummaryService,
    scope: &str,
    user: &str,
    now: DateTime<Utc>,
) -> Result<(Arc<String>, Source)> {
    let days = historical_days(now);
    let end = *days.last().expect("six days");
    let key = (scope.to_string(), user.to_string(), end);
    if let Some(h) = svc.caches.historical.get(&key) {
        record("historical", Source::Memory);
        return Ok((h, Source::Memory));
    }
    let stored: Option<String> =
        sqlx::query_scalar(include_str!("../../sql/summary/historical_get.sql"))
            .bind(scope)
            .bind(user)
            .bind(end)
            .fetch_optional(&svc.pool)
            .await?;
    if let Some(s) = stored {
        let h = Arc::new(s);
        svc.caches.historical.insert(key, h.clone());
        record("historical", Source::Db);
        return Ok((h, Source::Db));
    }
    let mut lines = Vec::new();
    for d in &days {
        let (m, _) = day_summaries(svc, &Batch::of(scope, user), *d, now).await?;
        if let Some(s) = m.get(user) {
            lines.push(format!("{} ({}): {s}", d, d.format("%A")));
        }
    }
    let (text, elapsed_ms) = if lines.is_empty() {
        (String::new(), 0)
    } else {
        let prompt = Prompt {
            system: HISTORICAL_SYSTEM.into(),
            header: format!("User: {user}\nDaily summaries from {} to {end}:", days[0]),
            lines,
            footer: "Summary:".into(),
            grammar: None,
            max_tokens: svc.config.historical_max_tokens,
        };
        let g = svc
            .model()?
            .generate(prompt)
            .await
            .map_err(|e| SummaryError::Model(e.0))?;
        (clip(&g.text, HISTORICAL_CHARS), g.elapsed_ms)
    };
    sqlx::query(include_str!("../../sql/summary/historical_put.sql"))
        .bind(scope)
        .bind(user)
        .bind(end)
        .bind(&text)
        .bind(elapsed_ms as i32)
        .execute(&svc.pool)
        .await?;
    let h = Arc::new(text);
    svc.caches.historical.insert(key, h.clone());
    record("historical", Source::Computed);
    Ok((h, Source::Computed))
}

const MERGE_SYSTEM: &str = "You merge three notes about one user into a single short context \
for a conversation. Facts are authoritative: when a note contradicts the facts, the facts win \
and the contradicting statement is left out. Balance today's observations with the longer \
pattern. Third person, plain sentences, no lists. Answer with the context only.";

/// Seed 004's `get_memories`: facts + current day + days 2–7, merged by the model under a
/// content-hash key. Never fails on the model: a missing part or a failed merge degrades
/// to what exists, in priority order, and says why (also as an event).
pub async fn user_context(
    svc: &SummaryService,
    scope: &str,
    user: &str,
    now: DateTime<Utc>,
) -> Result<UserContext> {
    let facts: String = sqlx::query_scalar(include_str!("../../sql/summary/facts.sql"))
        .bind(user)
        .bind(scope)
        .fetch_one(&svc.pool)
        .await?;
    let mut out = UserContext {
        context: String::new(),
        facts: facts.trim().to_string(),
        current_day: None,
        historical: None,
        sources: BTreeMap::new(),
        degraded: Vec::new(),
    };
    match day_summaries(svc, &Batch::of(scope, user), now.date_naive(), now).await {
        Ok((m, src)) => {
            out.sources.insert("current_day", src);
            out.current_day = m.get(user).cloned();
        }
        Err(SummaryError::Db(e)) => return Err(SummaryError::Db(e)),
        Err(e) => out.degraded.push(format!("current day: {e}")),
    }
    match historical(svc, scope, user, now).await {
        Ok((h, src)) => {
            out.sources.insert("historical", src);
            out.historical = Some(h.to_string()).filter(|h| !h.is_empty());
        }
        Err(SummaryError::Db(e)) => return Err(SummaryError::Db(e)),
        Err(e) => out.degraded.push(format!("historical: {e}")),
    }
    merge(svc, scope, user, &mut out).await?;
    if !out.degraded.is_empty() {
        let detail = json!({"scope": scope, "user_id": user, "reasons": out.degraded});
        event(&svc.pool, "summary_context_degraded", detail).await;
    }
    Ok(out)
}

/// The parts that exist, in seed 004's priority order, labelled.
pub fn fallback(facts: &str, current: Option<&str>, historical: Option<&str>) -> String {
    let mut parts = Vec::new();
    if !facts.is_empty() {
        parts.push(format!("Facts: {facts}"));
    }
    if let Some(c) = current {
        parts.push(format!("Today: {c}"));
    }
    if let Some(h) = historical {
        parts.push(format!("Earlier this week: {h}"));
    }
    parts.join("\n")
}

async fn merge(svc: &SummaryService, scope: &str, user: &str, out: &mut UserContext) -> Result<()> {
    let (cur, hist) = (out.current_day.clone(), out.historical.clone());
    let key = (
        scope.to_string(),
        user.to_string(),
        content_hash(&out.facts),
        content_hash(cur.as_deref().unwrap_or("")),
        content_hash(hist.as_deref().unwrap_or("")),
    );
    if cur.is_none() && hist.is_none() {
        // Nothing to merge: the facts are the context, no model call.
        out.context = fallback(&out.facts, None, None);
        out.sources.insert("merged", Source::Computed);
        return Ok(());
    }
    if let Some(c) = svc.caches.merged.get(&key) {
        record("merged", Source::Memory);
        out.sources.insert("merged", Source::Memory);
        out.context = c.to_string();
        return Ok(());
    }
    let stored: Option<String> =
        sqlx::query_scalar(include_str!("../../sql/summary/context_get.sql"))
            .bind(&key.0)
            .bind(&key.1)
            .bind(&key.2)
            .bind(&key.3)
            .bind(&key.4)
            .fetch_optional(&svc.pool)
            .await?;
    if let Some(c) = stored {
        svc.caches.merged.insert(key, Arc::new(c.clone()));
        record("merged", Source::Db);
        out.sources.insert("merged", Source::Db);
        out.context = c;
        return Ok(());
    }
    let merged = match model_merge(svc, &out.facts, cur.as_deref(), hist.as_deref()).await {
        Ok(m) => m,
        Err(e) => {
            out.degraded.push(format!("merge: {e}"));
            out.context = fallback(&out.facts, cur.as_deref(), hist.as_deref());
            return Ok(());
        }
    };
    sqlx::query(include_str!("../../sql/summary/context_put.sql"))
        .bind(&key.0)
        .bind(&key.1)
        .bind(&key.2)
        .bind(&key.3)
        .bind(&key.4)
        .bind(&merged)
        .bind(None::<String>)
        .execute(&svc.pool)
        .await?;
    svc.caches.merged.insert(key, Arc::new(merged.clone()));
    record("merged", Source::Computed);
    out.sources.insert("merged", Source::Computed);
    out.context = merged;
    Ok(())
}

async fn model_merge(
    svc: &SummaryService,
    facts: &str,
    current: Option<&str>,
    historical: Option<&str>,
) -> Result<String> {
    let prompt = Prompt {
        system: MERGE_SYSTEM.into(),
        header: format!(
            "<facts>{}</facts>\n<current_day>{}</current_day>\n<historical>{}</historical>",
            if facts.is_empty() { "(none)" } else { facts },
            current.unwrap_or("(none)"),
            historical.unwrap_or("(none)")
        ),
        lines: Vec::new(),
        footer: "Context:".into(),
        grammar: None,
        max_tokens: svc.config.merge_max_tokens,
    };
    let g = svc
        .model()?
        .generate(prompt)
        .await
        .map_err(|e| SummaryError::Model(e.0))?;
    Ok(facts_win(facts, &g.text))
}

/// Facts win: when the model's text lost the facts, they are put first verbatim, so a merge
/// can drop colour but never the factual memory.
pub fn facts_win(facts: &str, merged: &str) -> String {
    let merged = clip(merged, CONTEXT_CHARS);
    if facts.is_empty() || is_text_grounded_in_source(facts, &merged) {
        return merged;
    }
    let room = CONTEXT_CHARS.saturating_sub(facts.chars().count() + 1);
    clip(
        &format!("{facts} {}", clip(&merged, room)),
        CONTEXT_CHARS + facts.chars().count(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_seed_004() {
        let now = Utc.with_ymd_and_hms(2026, 3, 10, 14, 59, 59).unwrap();
        assert_eq!(hour_bucket(now), "2026-03-10-14");
        let days = historical_days(now);
        assert_eq!(days.len(), 6);
        assert_eq!(days[0], NaiveDate::from_ymd_opt(2026, 3, 4).unwrap());
        assert_eq!(days[5], NaiveDate::from_ymd_opt(2026, 3, 9).unwrap());
    }

    #[test]
    fn xml_messages_are_escaped() {
        let at = Utc.with_ymd_and_hms(2026, 3, 10, 9, 5, 0).unwrap();
        assert_eq!(
            xml_message(at, "u1", "Sam", "a <b> & c"),
            "<message><timestamp>2026-03-10 09:05</timestamp><author_id>u1</author_id><author>Sam</author><content>a &lt;b&gt; &amp; c</content></message>"
        );
    }

    #[test]
    fn fallback_keeps_priority_order() {
        assert_eq!(
            fallback(
                "Sam lives in Porto.",
                Some("Sam was tired."),
                Some("Sam runs daily.")
            ),
            "Facts: Sam lives in Porto.\nToday: Sam was tired.\nEarlier this week: Sam runs daily."
        );
        assert_eq!(fallback("", None, Some("h")), "Earlier this week: h");
    }

    #[test]
    fn facts_are_kept_when_the_merge_drops_them() {
        assert_eq!(
            facts_win("Sam lives in Porto.", "Sam is a cheerful runner."),
            "Sam lives in Porto. Sam is a cheerful runner."
        );
        assert_eq!(
            facts_win("Sam lives in Porto.", "Sam lives in Porto and runs."),
            "Sam lives in Porto and runs."
        );
    }
}
