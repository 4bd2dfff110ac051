//! One reply's own sampling: what a request asked for over the configured defaults, and
//! the stop strings that end a reply early. Both generation loops (alone and batched) read
//! it, so a turn samples the same whoever shares its decode steps.

/// A reply's sampling; each field left `None` keeps the worker's configured value
/// (`engine.temperature`, `engine.top_p`, `engine.sampling_seed`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sampling {
    /// 0 is greedy.
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub seed: Option<u32>,
    /// The reply ends as soon as its text holds one of these (which is then cut off it):
    /// [`super::Engine::stops`].
    pub stop: Vec<String>,
}

/// Where the reply's text must be cut: before the first stop string found at or after
/// byte `from` (the end of a worker-written start, which the model did not generate).
pub fn stop_at(text: &str, from: usize, stop: &[String]) -> Option<usize> {
    let from = (0..=from.min(text.len()))
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    stop.iter()
        .filter_map(|s| text[from..].find(s.as_str()).map(|i| from + i))
        .min()
}

/// How much of `text`, a reply still being generated, no stop string can cut off: all of
/// it but a tail that could still grow into a stop string, or up to a stop string found.
pub fn unstoppable_len(text: &str, from: usize, stop: &[String]) -> usize {
    if let Some(at) = stop_at(text, from, stop) {
        return at;
    }
    // The earliest start of a tail that is a proper prefix of some stop string.
    let from = from.min(text.len());
    (from..text.len())
        .filter(|&i| text.is_char_boundary(i))
        .find(|&i| stop.iter().any(|s| s.starts_with(&text[i..])))
        .unwrap_or(text.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stops(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_first_stop_string_after_the_start_cuts() {
        let s = stops(&["END", "\n\n"]);
        assert_eq!(stop_at("one\n\ntwo END", 0, &s), Some(3));
        assert_eq!(stop_at("END one END", 1, &s), Some(8));
        assert_eq!(stop_at("no stop here", 0, &s), None);
        assert_eq!(stop_at("é END", 1, &s), Some(3));
    }

    #[test]
    fn a_tail_that_may_grow_into_a_stop_string_waits() {
        let s = stops(&["User:", "###"]);
        assert_eq!(unstoppable_len("Hello Us", 0, &s), 6);
        assert_eq!(unstoppable_len("Hello #", 0, &s), 6);
        assert_eq!(unstoppable_len("Hello User: x", 0, &s), 6);
        assert_eq!(unstoppable_len("Hello", 0, &s), 5);
        assert_eq!(unstoppable_len("Hello", 0, &[]), 5);
        // Every settled prefix is a prefix of the final cut.
        let full = "Hi U there. Use it. User: bye";
        let cut = stop_at(full, 0, &s).unwrap();
        for end in 0..=full.len() {
            let n = unstoppable_len(&full[..end], 0, &s);
            assert!(n <= cut, "{end}: {n} > {cut}");
        }
    }
}
