//! Why a candidate fact was not stored: one reason per filter, so rejections are counted
//! by filter.

use std::fmt;

/// Why a candidate was not stored. One variant per filter, so rejections can be counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Nothing left after normalisation.
    Empty,
    TooShort,
    TooLong,
    /// Instruction or prompt-injection text; `pattern` is the rule that matched.
    Instruction {
        pattern: &'static str,
    },
    /// Chat-template control text such as `<|im_start|>`.
    RoleTag {
        pattern: &'static str,
    },
    /// A credential, or something shaped like one.
    Secret {
        pattern: &'static str,
    },
    /// Not supported by the source message.
    Ungrounded,
    /// Same fact as one already accepted from this message.
    Duplicate,
    /// Beyond the per-message cap (seed 002: 4).
    OverCap,
    /// About nobody the message names: the first person, or a name neither the speaker's
    /// nor in the message.
    Subject,
    /// The message negates what the fact states ("doesn't drink coffee" as "drinks coffee").
    NegationLost,
}

impl Reason {
    /// The filter's name, as counted in [`super::RejectCounts`] and logged.
    pub fn filter(&self) -> &'static str {
        match self {
            Reason::Empty => "empty",
            Reason::TooShort => "too_short",
            Reason::TooLong => "too_long",
            Reason::Instruction { .. } => "instruction",
            Reason::RoleTag { .. } => "role_tag",
            Reason::Secret { .. } => "secret",
            Reason::Ungrounded => "ungrounded",
            Reason::Duplicate => "duplicate",
            Reason::OverCap => "over_cap",
            Reason::Subject => "subject",
            Reason::NegationLost => "negation_lost",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Instruction { pattern }
            | Reason::RoleTag { pattern }
            | Reason::Secret { pattern } => write!(f, "{} ({pattern:?})", self.filter()),
            _ => f.write_str(self.filter()),
        }
    }
}
