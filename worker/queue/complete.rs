//! The fenced completion: reply, dialogue rows, log row and lease release in one
//! transaction, for one turn or a group-committed batch.

use std::collections::HashSet;

use sqlx::PgPool;

use super::finish::insert_log_rows;
use super::types::{QueueError, Result};
use crate::snapshot::render_segments;
use crate::turn::ClaimedTurn;
use crate::turn::TurnOutput;

/// A finished turn waiting to be committed.
#[derive(Debug, Clone)]
pub struct Completion {
    pub turn: ClaimedTurn,
    pub output: TurnOutput,
}

/// Writes the reply, the dialogue rows, the KV record, the log row and frees the lease:
/// all or nothing.
pub async fn complete(pool: &PgPool, turn: &ClaimedTurn, output: TurnOutput) -> Result<()> {
    let batch = [Completion {
        turn: turn.clone(),
        output,
    }];
    let mut done = complete_many(pool, &batch).await?;
    done.pop().unwrap_or(Err(QueueError::Fenced(turn.id)))
}

/// Commits a batch of completions in one transaction (group commit): one WAL flush and a
/// handful of set-based statements for the whole batch. Each turn is still fenced on its
/// own: a turn whose lease was lost gets `Err(Fenced)` and writes nothing, the others
/// commit. The result has one entry per input, in order. `Err` for the call as a whole
/// means nothing was committed.
pub async fn complete_many(pool: &PgPool, batch: &[Completion]) -> Result<Vec<Result<()>>> {
    if batch.is_empty() {
        return Ok(Vec::new());
    }
    // The lease keys go to the fence and the release; only complete.sql needs the texts,
    // so the messages and replies cross the wire once.
    let keys = per_turn(batch, |c| [("owner", serde_json::json!(c.turn.owner))]);
    let texts = per_turn(batch, |c| {
        [
            ("message", serde_json::json!(c.turn.message)),
            ("reply", serde_json::json!(c.output.reply)),
        ]
    });
    // Scope: every completion of the batch, each guarded by its own fencing token.
    let mut tx = pool.begin().await?;
    let held: Vec<i64> = sqlx::query_scalar(include_str!("../../sql/queue/fence_many.sql"))
        .bind(&keys)
        .fetch_all(&mut *tx)
        .await?;
    let done: HashSet<i64> = if held.is_empty() {
        Default::default()
    } else {
        let ids: Vec<i64> = sqlx::query_scalar(include_str!("../../sql/queue/complete.sql"))
            .bind(&texts)
            .bind(&held)
            .fetch_all(&mut *tx)
            .await?;
        ids.into_iter().collect()
    };
    if !done.is_empty() {
        let rows = batch
            .iter()
            .filter(|c| done.contains(&c.turn.id.0))
            .map(|c| c.output.log.row(&c.turn))
            .collect();
        insert_log_rows(&mut tx, rows).await?;
        let committed: Vec<i64> = done.iter().copied().collect();
        let records = kv_records(batch);
        if !records.is_empty() {
            sqlx::query(include_str!("../../sql/queue/session_kv.sql"))
                .bind(serde_json::Value::Array(records))
                .bind(&committed)
                .execute(&mut *tx)
                .await?;
        }
        let ops = memory_ops(batch);
        if !ops.is_empty() {
            sqlx::query(include_str!("../../sql/queue/memory_ops.sql"))
                .bind(serde_json::Value::Array(ops))
                .bind(&committed)
                .fetch_all(&mut *tx)
                .await?;
        }
        sqlx::query(include_str!("../../sql/queue/release_many.sql"))
            .bind(&keys)
            .bind(&committed)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(batch
        .iter()
        .map(|c| {
            if done.contains(&c.turn.id.0) {
                Ok(())
            } else {
                Err(QueueError::Fenced(c.turn.id))
            }
        })
        .collect())
}

/// One object per completion: the turn's fencing key (id, session, token), then the
/// fields `more` adds for the statement the array goes to.
fn per_turn<const N: usize>(
    batch: &[Completion],
    more: impl Fn(&Completion) -> [(&'static str, serde_json::Value); N],
) -> serde_json::Value {
    let rows = batch.iter().map(|c| {
        let mut row = serde_json::json!({
            "turn_id": c.turn.id.0,
            "session_id": c.turn.session_id,
            "fencing_token": c.turn.fencing_token,
        });
        for (key, value) in more(c) {
            row[key] = value;
        }
        row
    });
    serde_json::Value::Array(rows.collect())
}

/// The batch's in-chat memory commands, for `memory_ops.sql`.
fn memory_ops(batch: &[Completion]) -> Vec<serde_json::Value> {
    batch
        .iter()
        .flat_map(|c| {
            c.output.memory_ops.iter().map(|op| {
                let (kind, text) = op.as_job();
                serde_json::json!({"turn_id": c.turn.id.0, "kind": kind, "text": text})
            })
        })
        .collect()
}

/// The batch's KV records, for `session_kv.sql` (which keeps only the committed ones).
fn kv_records(batch: &[Completion]) -> Vec<serde_json::Value> {
    batch
        .iter()
        .filter_map(|c| {
            let kv = c.output.kv.as_ref()?;
            Some(serde_json::json!({
                "turn_id": c.turn.id.0,
                "session_id": c.turn.session_id,
                "user_id": c.turn.user_id,
                "character_id": c.turn.character_id,
                "model_sha": kv.model_sha,
                "token_ids": kv.token_ids,
                "segments": render_segments(&kv.segments),
                "digest_version": kv.digest_version,
            }))
        })
        .collect()
}
