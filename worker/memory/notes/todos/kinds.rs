//! What the detector finds and the store keeps: the kinds of open loop, a found todo, how
//! a closing ends one, and the limits both apply.

use chrono::NaiveDate;
use serde::Serialize;

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
pub(super) const MAX_TEXT_CHARS: usize = 160;
/// A closing clause must share this share of an open todo's content words...
pub(super) const CLOSE_SHARE: f64 = 0.5;
/// ...and at least one word.
pub(super) const CLOSE_MIN_SHARED: usize = 1;
