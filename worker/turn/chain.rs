//! The chain hash of a dialogue, as the completion stores it per turn
//! (`kvmem_chain_hash`, migration 20261203000200): a chat request's history hashed the same
//! way names the turn whose session it continues, with no id of kvmem's in the request.

use sha2::{Digest, Sha256};

/// The characters trimmed at both ends of a message or reply before hashing. Front-ends
/// trim or pad the ends of what they show; the inside is kept word for word, so two
/// dialogues that differ anywhere but at the ends never hash alike.
const TRIMMED: [char; 4] = [' ', '\t', '\r', '\n'];

/// A message or reply as the chain hashes it.
pub fn normalise(text: &str) -> &str {
    text.trim_matches(TRIMMED)
}

/// The hash after one more exchange: sha256 of the previous hash (empty for the first
/// exchange) and the two texts, each prefixed by its length in bytes (big-endian u64), so
/// no two dialogues hash alike by moving text between a message and its reply.
pub fn next(prev: Option<&[u8]>, message: &str, reply: &str) -> Vec<u8> {
    let mut h = Sha256::new();
    h.update(prev.unwrap_or_default());
    for part in [normalise(message), normalise(reply)] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    h.finalize().to_vec()
}

/// The hash after each exchange of a dialogue, in order.
pub fn hashes<'a>(exchanges: impl IntoIterator<Item = (&'a str, &'a str)>) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = Vec::new();
    for (message, reply) in exchanges {
        let h = next(out.last().map(Vec::as_slice), message, reply);
        out.push(h);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ends_are_trimmed_and_the_inside_is_kept() {
        assert_eq!(next(None, " hi\n", "yo "), next(None, "hi", "yo"));
        assert_ne!(next(None, "hi  there", "yo"), next(None, "hi there", "yo"));
    }

    #[test]
    fn text_moved_between_message_and_reply_changes_the_hash() {
        assert_ne!(next(None, "ab", "c"), next(None, "a", "bc"));
    }

    #[test]
    fn each_hash_covers_everything_before_it() {
        let a = hashes([("one", "1"), ("two", "2")]);
        let b = hashes([("uno", "1"), ("two", "2")]);
        assert_eq!(a.len(), 2);
        assert_ne!(a[1], b[1]);
        assert_eq!(a[1], next(Some(&a[0]), "two", "2"));
    }
}
