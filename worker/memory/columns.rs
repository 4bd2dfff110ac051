//! Which columns of `memory_messages` hold a message's vectors: pgvector's HNSW index needs
//! one width per column, so each width an embedder may have (384: e5-small and MiniLM; 768:
//! EmbeddingGemma) has its own pair, and one statement text serves every width.
//!
//! The statements in `sql/memory/` name the 384-wide columns. A statement that reads or
//! writes message vectors says so with [`MARK`]; for a 768-wide embedder its column names
//! are rewritten once, word by word, and the text is kept for the life of the process.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// The line a statement over message vectors carries, so that the rewrite can refuse a
/// statement that also names `memories`' columns of the same names.
pub const MARK: &str = "-- kvmem: message vectors";

/// The vector widths `memory_messages` has columns for.
pub const WIDTHS: [usize; 2] = [384, 768];

/// The message-vector columns of one width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Columns {
    suffix: &'static str,
}

impl Columns {
    /// The columns the migrations first created, and those of a service with no embedder
    /// (its statements then match no vector at all).
    pub const NARROW: Columns = Columns { suffix: "" };
    pub const WIDE: Columns = Columns { suffix: "_768" };

    /// The columns for vectors `dims` wide; `None` for a width with no columns.
    pub fn of_width(dims: usize) -> Option<Columns> {
        match dims {
            384 => Some(Columns::NARROW),
            768 => Some(Columns::WIDE),
            _ => None,
        }
    }

    /// The columns a query vector is compared with: those of its width (the narrow ones
    /// for a width without columns, which no embedder loads with).
    pub fn of_query(q: &pgvector::Vector) -> Columns {
        Columns::of_width(q.as_slice().len()).unwrap_or(Columns::NARROW)
    }

    /// `sql` for these columns. `sql` must carry [`MARK`]: a statement without it is
    /// returned unchanged for the narrow columns and is a bug for any other.
    pub fn sql(self, sql: &'static str) -> &'static str {
        if self.suffix.is_empty() {
            return sql;
        }
        assert!(
            sql.contains(MARK),
            "a statement without {MARK:?} given the {}-wide columns",
            self.suffix
        );
        static REWRITTEN: OnceLock<Mutex<HashMap<(usize, &'static str), &'static str>>> =
            OnceLock::new();
        let cache = REWRITTEN.get_or_init(Default::default);
        let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
        // Keyed by the text's address: the statements are `include_str!`s, each one string
        // for the life of the process, so the cache holds one rewrite per file and width.
        cache
            .entry((sql.as_ptr() as usize, self.suffix))
            .or_insert_with(|| Box::leak(rename(sql, self.suffix).into_boxed_str()))
    }
}

/// The narrow columns' names (and their indexes' names, which the planner statistics read)
/// with `suffix` put where the wide ones have it.
fn rename(sql: &str, suffix: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 64);
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        out.push_str(word);
        match word.as_str() {
            "embedding" | "embed_model" | "span_embedding" | "span_embed_model" => {
                out.push_str(suffix)
            }
            _ => {}
        }
        if word == "memory_messages_embedding_hnsw" {
            out.truncate(out.len() - "_hnsw".len());
            out.push_str(suffix);
            out.push_str("_hnsw");
        }
        word.clear();
    };
    for c in sql.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wide_columns_are_renamed_word_by_word() {
        let sql = "-- kvmem: message vectors\nSELECT (1 - (embedding <=> $5::vector)) FROM memory_messages \
                   WHERE span_embedding IS NULL AND embed_model = $2 AND span_embed_model = $3 \
                   AND m.embedding_other = 1 AND to_regclass('memory_messages_embedding_hnsw') \
                   IS NOT NULL ORDER BY v.embedding";
        let wide = Columns::WIDE.sql(Box::leak(sql.to_string().into_boxed_str()));
        assert_eq!(
            wide,
            "-- kvmem: message vectors\nSELECT (1 - (embedding_768 <=> $5::vector)) FROM memory_messages \
             WHERE span_embedding_768 IS NULL AND embed_model_768 = $2 AND span_embed_model_768 = $3 \
             AND m.embedding_other = 1 AND to_regclass('memory_messages_embedding_768_hnsw') \
             IS NOT NULL ORDER BY v.embedding_768"
        );
        assert_eq!(Columns::NARROW.sql(sql_static()), sql_static());
    }

    fn sql_static() -> &'static str {
        "SELECT embedding FROM memories"
    }

    #[test]
    #[should_panic(expected = "without")]
    fn an_unmarked_statement_is_refused_for_the_wide_columns() {
        Columns::WIDE.sql("SELECT embedding FROM memories");
    }

    #[test]
    fn widths_map_to_their_columns() {
        assert_eq!(Columns::of_width(384), Some(Columns::NARROW));
        assert_eq!(Columns::of_width(768), Some(Columns::WIDE));
        assert_eq!(Columns::of_width(1024), None);
        for w in WIDTHS {
            assert!(Columns::of_width(w).is_some());
        }
    }
}
