//! Queueing a chat request that names no session by the conversation it carries: its
//! history's chain hash ([`crate::turn::chain`]) finds the session whose stored dialogue it
//! is, which the turn continues, or branches at an earlier turn (a regenerate, an edit), or
//! else a new session starts with the history as its dialogue. A conversation named by a
//! header gets the history as its dialogue when it is new. All in one transaction.

use sqlx::{PgConnection, PgPool};

use super::enqueue::{lock_and_find_repeat, queue_in, NewTurn, Repeat};
use super::types::{QueueError, Result};
use crate::turn::{chain, TurnId};

/// A chat request's conversation: who asks, the history before its message as
/// (message, reply) exchanges, and the message.
#[derive(Debug, Clone, Copy)]
pub struct Conversation<'a> {
    pub user_id: &'a str,
    pub character_id: i64,
    pub message: &'a str,
    pub history: &'a [(String, String)],
    pub idempotency_key: Option<&'a str>,
    /// The turn's own sampling (`turns.options`); `None`: the worker's configured sampling.
    pub options: Option<&'a serde_json::Value>,
    /// How much history a new session may import from the request.
    pub limits: HistoryLimits,
}

/// Bounds on the history a request brings into a new session (`http.max_history_*`):
/// without them one request could write tens of thousands of turns in one transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryLimits {
    /// Messages, user and assistant counted apart.
    pub messages: usize,
    /// Characters in all.
    pub chars: usize,
}

impl HistoryLimits {
    /// The history within these limits, or the limit it passes, named as the setting.
    pub fn check(&self, history: &[(String, String)]) -> Result<()> {
        let messages = history.len() * 2;
        if messages > self.messages {
            return Err(QueueError::Invalid(format!(
                "the request's history has {messages} messages; a new session imports at most \
                 {} (http.max_history_messages)",
                self.messages
            )));
        }
        let chars: usize = history
            .iter()
            .map(|(m, r)| m.chars().count() + r.chars().count())
            .sum();
        if chars > self.chars {
            return Err(QueueError::Invalid(format!(
                "the request's history has {chars} characters; a new session imports at most \
                 {} (http.max_history_chars)",
                self.chars
            )));
        }
        Ok(())
    }
}

/// How a request found its session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// A repeat of a request (a retry, or the same idempotency key): its turn.
    Repeat,
    /// The history is the session's whole stored dialogue: the turn continues it.
    Continued,
    /// The history is the session's dialogue up to an earlier turn: a new session holds a
    /// copy of it up to there, and the turn.
    Branched { from: String, at_turn: i64 },
    /// Nothing matched: a new session, with the history (if any) as its dialogue.
    Started,
}

/// Where a request's turn went.
#[derive(Debug, Clone)]
pub struct Placed {
    pub turn: TurnId,
    pub session_id: String,
    pub found: Found,
}

/// Queues the request's message in the session its history names (see the module doc).
/// `repeat.hash` is the request's hash without a session: a repeat of the request, while it
/// is a retry as `sql/queue/repeat_of_request.sql` says, is the turn the first one queued.
pub async fn enqueue_matched(
    pool: &PgPool,
    c: &Conversation<'_>,
    repeat: Repeat<'_>,
) -> Result<Placed> {
    // Scope: the repeat check, the match, the branch copy or the import, and the enqueue,
    // under the lock of this user's chats with this character.
    let mut tx = pool.begin().await?;
    sqlx::query(include_str!("../../sql/queue/conversation_lock.sql"))
        .bind(c.user_id)
        .bind(c.character_id)
        .execute(&mut *tx)
        .await?;
    if let Some((id, session_id)) = repeat_of(&mut tx, c, repeat).await? {
        tx.commit().await?;
        let found = Found::Repeat;
        let turn = TurnId(id);
        return Ok(Placed {
            turn,
            session_id,
            found,
        });
    }
    let hashes = chain::hashes(c.history.iter().map(|(m, r)| (m.as_str(), r.as_str())));
    let matched: Option<(i64, String, bool)> = match hashes.last() {
        None => None,
        Some(last) => {
            sqlx::query_as(include_str!("../../sql/queue/chain_match.sql"))
                .bind(c.user_id)
                .bind(c.character_id)
                .bind(last)
                .fetch_optional(&mut *tx)
                .await?
        }
    };
    let (session_id, found) = match matched {
        Some((_, session, true)) => (session, Found::Continued),
        Some((at_turn, from, false)) => {
            let session = new_session(&mut tx).await?;
            branch(&mut tx, c.user_id, &session, &from, at_turn).await?;
            (session, Found::Branched { from, at_turn })
        }
        None => {
            let session = new_session(&mut tx).await?;
            import(&mut tx, &session, c, &hashes).await?;
            (session, Found::Started)
        }
    };
    let turn = NewTurn {
        session_id: &session_id,
        user_id: c.user_id,
        character_id: c.character_id,
        message: c.message,
        idempotency_key: c.idempotency_key,
        options: c.options,
    };
    let id = queue_in(&mut tx, &turn, repeat.hash).await?;
    tx.commit().await?;
    Ok(Placed {
        turn: id,
        session_id,
        found,
    })
}

/// Queues `turn` in the session a header named, as the chat endpoint queues in a named
/// session (a repeat of the request is its turn), and when the session has no turn yet,
/// with the request's history as its dialogue first. Returns the turn and whether it was
/// there already.
pub async fn enqueue_named(
    pool: &PgPool,
    turn: &NewTurn<'_>,
    history: &[(String, String)],
    limits: HistoryLimits,
    repeat: Repeat<'_>,
) -> Result<(TurnId, bool)> {
    // Scope: the repeat check, the import into a new session and the enqueue, under the
    // session's enqueue lock.
    let mut tx = pool.begin().await?;
    if let Some(id) = lock_and_find_repeat(&mut tx, turn, repeat).await? {
        tx.commit().await?;
        return Ok((id, true));
    }
    let fresh: bool = sqlx::query_scalar(include_str!("../../sql/queue/session_is_new.sql"))
        .bind(turn.session_id)
        .fetch_one(&mut *tx)
        .await?;
    if fresh && !history.is_empty() {
        let c = Conversation {
            user_id: turn.user_id,
            character_id: turn.character_id,
            message: turn.message,
            history,
            idempotency_key: None,
            options: turn.options,
            limits,
        };
        let hashes = chain::hashes(history.iter().map(|(m, r)| (m.as_str(), r.as_str())));
        import(&mut tx, turn.session_id, &c, &hashes).await?;
    }
    let id = queue_in(&mut tx, turn, repeat.hash).await?;
    tx.commit().await?;
    Ok((id, false))
}

/// The turn this request repeats: the same idempotency key's, or a retry of the same
/// request's.
async fn repeat_of(
    tx: &mut PgConnection,
    c: &Conversation<'_>,
    repeat: Repeat<'_>,
) -> Result<Option<(i64, String)>> {
    if let Some(key) = c.idempotency_key {
        return Ok(
            sqlx::query_as(include_str!("../../sql/queue/idempotent_turn.sql"))
                .bind(c.user_id)
                .bind(key)
                .fetch_optional(&mut *tx)
                .await?,
        );
    }
    Ok(
        sqlx::query_as(include_str!("../../sql/queue/repeat_of_request.sql"))
            .bind(c.user_id)
            .bind(c.character_id)
            .bind(repeat.hash)
            .bind(repeat.retry)
            .bind(repeat.window_i64())
            .fetch_optional(&mut *tx)
            .await?,
    )
}

async fn new_session(tx: &mut PgConnection) -> Result<String> {
    Ok(
        sqlx::query_scalar(include_str!("../../sql/queue/new_session.sql"))
            .fetch_one(&mut *tx)
            .await?,
    )
}

/// Copies `from`'s dialogue up to `at_turn` into `session`, leaving memory as it was.
async fn branch(
    tx: &mut PgConnection,
    user_id: &str,
    session: &str,
    from: &str,
    at_turn: i64,
) -> Result<()> {
    let copies: Vec<i64> = sqlx::query_scalar(include_str!("../../sql/queue/branch_copy.sql"))
        .bind(session)
        .bind(from)
        .bind(at_turn)
        .fetch_all(&mut *tx)
        .await?;
    sqlx::query(include_str!("../../sql/queue/branch_unindex.sql"))
        .bind(user_id)
        .bind(&copies)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// The request's history as `session`'s dialogue, each exchange with its chain hash.
async fn import(
    tx: &mut PgConnection,
    session: &str,
    c: &Conversation<'_>,
    hashes: &[Vec<u8>],
) -> Result<()> {
    if c.history.is_empty() {
        return Ok(());
    }
    c.limits.check(c.history)?;
    let rows: Vec<serde_json::Value> = c
        .history
        .iter()
        .zip(hashes)
        .map(|((message, reply), hash)| {
            serde_json::json!({"message": message, "reply": reply, "hash": hex::encode(hash)})
        })
        .collect();
    sqlx::query(include_str!("../../sql/queue/import_history.sql"))
        .bind(session)
        .bind(c.user_id)
        .bind(c.character_id)
        .bind(serde_json::Value::Array(rows))
        .execute(&mut *tx)
        .await?;
    Ok(())
}
