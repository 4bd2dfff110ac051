//! Seed 002's `memoryLine`: a reply may end with a hidden tail, `[[remember: <line>]]`,
//! asking the worker to keep one line about the shared story. The tail is cut off the
//! reply before anything stores, shows or keeps it in the KV, so the user never sees it
//! and `messages.content` never holds it; the line itself goes to the memory lane, whose
//! injection and grounding filters decide whether it is stored.
//!
//! The cut is deliberately greedy: everything from the first marker on goes, a closed tail
//! or not, so a tail cut short by the reply budget or followed by more text cannot leak.

/// Markers that open a tail (matched without regard to case).
const OPENERS: [&str; 2] = ["[[remember:", "[[memory:"];
const CLOSE: &str = "]]";
/// A line longer than this is not a line; the memory SQL API's floor is 3.
pub const MAX_LINE_CHARS: usize = 240;
const MIN_LINE_CHARS: usize = 3;

/// A reply with its tail taken off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// What the user sees and the database stores.
    pub reply: String,
    /// The line to remember: a closed tail of a sensible length.
    pub line: Option<String>,
    /// A tail was found (and removed), kept or not.
    pub stripped: bool,
}

/// Cuts the hidden tail off `reply`.
pub fn split(reply: &str) -> Split {
    let at = OPENERS.iter().filter_map(|m| ascii_find(reply, m)).min();
    let Some(at) = at else {
        return Split {
            reply: reply.to_string(),
            line: None,
            stripped: false,
        };
    };
    let tail = &reply[at..];
    let body_start = tail.find(':').map_or(tail.len(), |i| i + 1);
    let line = tail[body_start..].find(CLOSE).and_then(|end| {
        let text = tail[body_start..body_start + end]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let n = text.chars().count();
        (MIN_LINE_CHARS..=MAX_LINE_CHARS)
            .contains(&n)
            .then_some(text)
    });
    Split {
        reply: reply[..at].trim_end().to_string(),
        line,
        stripped: true,
    }
}

/// Byte offset of the ASCII `needle` in `hay`, ignoring ASCII case (byte-wise, so the
/// offset is valid in `hay` itself, which `to_lowercase` would not guarantee).
fn ascii_find(hay: &str, needle: &str) -> Option<usize> {
    let (h, n) = (hay.as_bytes(), needle.as_bytes());
    (0..h.len().saturating_sub(n.len() - 1))
        .find(|&i| h[i..i + n.len()].eq_ignore_ascii_case(n) && hay.is_char_boundary(i))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_tail_is_removed_and_kept() {
        let s = split("The gate held. [[remember: Vex guards the north gate]]");
        assert_eq!(s.reply, "The gate held.");
        assert_eq!(s.line.as_deref(), Some("Vex guards the north gate"));
        assert!(s.stripped);
    }

    #[test]
    fn nothing_after_the_marker_leaks() {
        // Cut short by the reply budget: removed, not kept.
        let s = split("Sure thing! [[Remember: the dragon's na");
        assert_eq!((s.reply.as_str(), s.line), ("Sure thing!", None));
        // Text after a closed tail goes too.
        let s = split("Yes.\n[[memory: the map is in the tower]] and more");
        assert_eq!(s.reply, "Yes.");
        assert_eq!(s.line.as_deref(), Some("the map is in the tower"));
    }

    #[test]
    fn ordinary_replies_are_untouched() {
        for r in [
            "Hello [there]!",
            "I will remember: yes.",
            "Ünïcode [[ text",
            "",
        ] {
            let s = split(r);
            assert_eq!((s.reply.as_str(), s.line, s.stripped), (r, None, false));
        }
    }

    #[test]
    fn empty_or_huge_lines_are_not_kept() {
        assert_eq!(split("ok [[remember: ]]").line, None);
        let long = format!("ok [[remember: {}]]", "x".repeat(MAX_LINE_CHARS + 1));
        let s = split(&long);
        assert_eq!((s.reply.as_str(), s.line), ("ok", None));
    }
}
