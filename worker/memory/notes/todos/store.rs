//! The todos as stored: one message's closings and new todos applied in a transaction,
//! and a character's todos listed.

use chrono::{DateTime, NaiveDate, Utc};
use serde::Serialize;
use sqlx::PgPool;

use crate::memory::error::Result;
use crate::memory::store::filters::{check_fact, dedup_key, Verdict};

use super::detect::{close_score, closings, detect};

/// A stored todo.
#[derive(Debug, Clone, Serialize, PartialEq, sqlx::FromRow)]
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
    // Scope: one message's closings and new todos, and the open list they are matched
    // against; a failure keeps none of them, so the rerun sees the todos as they were.
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
                sqlx::query_scalar(include_str!("../../../../sql/memory/todo_close.sql"))
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
        let id: i64 = sqlx::query_scalar(include_str!("../../../../sql/memory/todo_upsert.sql"))
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
    let rows = sqlx::query_as(include_str!("../../../../sql/memory/todos_list.sql"))
        .bind(user)
        .bind(character)
        .bind(open_only)
        .fetch_all(conn)
        .await?;
    Ok(rows)
}
