//! Seed 002's operator views, the daily journal and MEMORY.md, rendered from Postgres on
//! demand instead of kept as files: they are for people and are never read into prompts.

use chrono::{DateTime, NaiveDate, TimeZone, Utc};
use sqlx::PgPool;

use super::error::{MemoryError, Result};
use super::search::cards;
use super::store::{self, Scope};

/// One message of the journal's day.
#[derive(sqlx::FromRow)]
struct JournalRow {
    at: DateTime<Utc>,
    speaker: String,
    text: String,
    session_id: String,
}

/// `YYYY-MM-DD.md`: one line per message of that UTC day.
pub async fn journal(pool: &PgPool, scope: &Scope, day: &str) -> Result<String> {
    scope.validate()?;
    let d = NaiveDate::parse_from_str(day, "%Y-%m-%d")
        .map_err(|e| MemoryError::Invalid(format!("--date {day:?} is not YYYY-MM-DD: {e}")))?;
    let start = Utc.from_utc_datetime(&d.and_hms_opt(0, 0, 0).expect("midnight"));
    let rows = sqlx::query_as::<_, JournalRow>(include_str!("../../sql/memory/journal_day.sql"))
        .bind(&scope.user_id)
        .bind(&scope.guild_id)
        .bind(start)
        .fetch_all(pool)
        .await?;
    let mut out = format!("# {day}\n\n");
    for r in &rows {
        out.push_str(&format!(
            "- {} [{}] {}: {}\n",
            r.at.format("%H:%M:%S"),
            r.session_id,
            r.speaker,
            r.text.replace('\n', " ")
        ));
    }
    if rows.is_empty() {
        out.push_str("_No messages._\n");
    }
    Ok(out)
}

/// `MEMORY.md`: current facts by kind, lore, entity cards and the recent journal days.
pub async fn snapshot(pool: &PgPool, scope: &Scope) -> Result<String> {
    let facts = store::facts(pool, scope, None, 1000).await?;
    let mut out = format!("# MEMORY.md — {}\n\n", scope.user_id);
    for (title, kind) in [
        ("Profile", "PROFILE"),
        ("People", "PEOPLE"),
        ("Projects", "PROJECT"),
    ] {
        out.push_str(&format!("## {title}\n\n"));
        let mut any = false;
        for f in facts
            .iter()
            .filter(|f| f.kind == kind && f.subject == "user")
        {
            any = true;
            let pin = if f.pinned { " (pinned)" } else { "" };
            out.push_str(&format!(
                "- {}{pin} — {} [{}]\n",
                f.text, f.fact_type, f.source
            ));
        }
        if !any {
            out.push_str("_None._\n");
        }
        out.push('\n');
    }
    out.push_str("## Ongoing lore\n\n");
    let lore: Vec<_> = facts.iter().filter(|f| f.subject != "user").collect();
    if lore.is_empty() {
        out.push_str("_None._\n");
    }
    for f in lore {
        out.push_str(&format!("- {}: {}\n", f.subject, f.text));
    }
    out.push_str("\n## Entity cards\n\n");
    for c in cards::cards_for_refs(pool, scope, None).await? {
        out.push_str(&format!("- {}\n", c.text));
    }
    out.push_str("\n## Recent journal days\n\n");
    let days: Vec<(NaiveDate, i64)> =
        sqlx::query_as(include_str!("../../sql/memory/recent_days.sql"))
            .bind(&scope.user_id)
            .bind(&scope.guild_id)
            .fetch_all(pool)
            .await?;
    for (d, n) in &days {
        out.push_str(&format!("- {d}.md ({n} messages)\n"));
    }
    Ok(out)
}
