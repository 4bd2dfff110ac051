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

/// How much of `text`, a reply still being generated, the stored reply holds whatever the
/// model adds: [`split`] cuts at the first marker and trims the whitespace before it, so
/// the end of `text` that could still grow into a marker, and the whitespace before it,
/// are not settled yet. Once a marker has begun, nothing after it ever is.
pub fn settled_len(text: &str) -> usize {
    let at = OPENERS.iter().filter_map(|m| ascii_find(text, m)).min();
    let end = at.unwrap_or_else(|| {
        OPENERS
            .iter()
            .filter_map(|m| partial_at_end(text, m))
            .min()
            .unwrap_or(text.len())
    });
    text[..end].trim_end().len()
}

/// Where the longest end of `hay` that is a proper start of `marker` (ignoring ASCII case)
/// begins.
fn partial_at_end(hay: &str, marker: &str) -> Option<usize> {
    (1..marker.len()).rev().find_map(|k| {
        let at = hay.len().checked_sub(k)?;
        (hay.is_char_boundary(at)
            && hay.as_bytes()[at..].eq_ignore_ascii_case(&marker.as_bytes()[..k]))
        .then_some(at)
    })
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
    fn settled_text_never_holds_what_split_would_cut() {
        // What may still become a marker, and the whitespace before it, wait.
        assert_eq!(settled_len("Hello [[Reme"), "Hello".len());
        assert_eq!(settled_len("Hello ["), "Hello".len());
        assert_eq!(settled_len("Hello  \n"), "Hello".len());
        assert_eq!(settled_len("a [b"), "a [b".len());
        assert_eq!(settled_len("x [[memory: y"), "x".len());
        assert_eq!(settled_len("done. [[remember: k]] more"), "done.".len());
        assert_eq!(settled_len("Ünï ["), "Ünï".len());
        assert_eq!(settled_len(""), 0);
        // Every prefix's settled text is a prefix of what split keeps of the whole reply.
        let whole = "The gate held. \n[[remember: Vex guards the gate]] extra";
        let kept = split(whole).reply;
        for end in (0..=whole.len()).filter(|&i| whole.is_char_boundary(i)) {
            let n = settled_len(&whole[..end]);
            assert!(kept.starts_with(&whole[..n]), "{:?}", &whole[..end]);
        }
        let plain = "No tail here, just [brackets] and  spaces ";
        for end in (0..=plain.len()).filter(|&i| plain.is_char_boundary(i)) {
            assert!(plain.starts_with(&plain[..settled_len(&plain[..end])]));
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
