//! A turn's identity and the claim on it: what the queue hands a worker and every layer
//! names a turn by.

use std::fmt;

use serde::Serialize;

/// A turn's primary key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, sqlx::Type)]
#[sqlx(transparent)]
pub struct TurnId(pub i64);

impl fmt::Display for TurnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// States of the `turn_state` enum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, sqlx::Type)]
#[sqlx(type_name = "turn_state", rename_all = "lowercase")]
#[serde(rename_all = "lowercase")]
pub enum TurnState {
    Queued,
    Running,
    Done,
    Failed,
    Dead,
}

/// A turn this worker holds the lease for.
#[derive(Debug, Clone)]
pub struct ClaimedTurn {
    pub id: TurnId,
    pub session_id: String,
    pub user_id: String,
    pub character_id: i64,
    pub message: String,
    /// The turn's own sampling (`turns.options`); `None`: as configured.
    pub options: Option<serde_json::Value>,
    pub lane: String,
    pub attempt: i32,
    pub max_attempts: i32,
    pub fencing_token: i64,
    pub owner: String,
    /// The session's last committed turn when this one was claimed: the only turn, with
    /// its committing fence, whose snapshot this turn may resume. Read with the claim, so
    /// the turn asks the queue nothing more; under the session's lease no other turn of the
    /// session can commit until this one ends.
    pub last_done: LastDone,
}

/// A session's last committed turn and the fencing token its completion recorded (`None`
/// for a turn committed before tokens were recorded); `None` before a first turn.
pub type LastDone = Option<(i64, Option<i64>)>;
