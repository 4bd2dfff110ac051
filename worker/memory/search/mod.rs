//! Retrieval over both the facts and the dialogue: lexical (BM25 over the user's own term
//! statistics), semantic (MiniLM cosine over one user's message vectors, and over the
//! vectors of each message's span of turns), the question in a named speaker's voice and
//! time windows from the query, fused by a named ranker, so a question can be answered
//! from an extracted fact or from the exact turn that holds it, with provenance.
//!
//! The room's files: `words` (the text rules every leg shares), `lexical` (BM25),
//! `vector` (the nearest vectors, exact or through the index), `spans`
//! (the span vectors: filled after import, searched and spread to their turns), `rows`
//! (the candidate messages read back), `voice` (the question as its named speaker would
//! ask it), `messages` (the dialogue's legs fused), `facts` (the extracted facts'
//! scoring), `rank` (the rankers) and `components` (a score's parts and recall's gate);
//! `types` holds the request and the hits, `run` the search itself, `recall_gate` the
//! lines a turn recalls.

pub mod cards;
pub mod components;
mod facts;
mod lexical;
mod messages;
pub mod rank;
mod recall_gate;
mod rows;
mod run;
#[cfg(test)]
mod scope;
pub mod spans;
pub mod timeq;
mod types;
mod vector;
mod voice;
mod words;

pub use components::Components;
pub use recall_gate::lines_to_recall;
pub use run::{gather, search, Gathered};
pub use types::{Hit, HitKind, SearchRequest, SearchResponse};
pub use voice::first_person;
pub use words::{content_words, message_key, names, overlap, stem};

// The search's statements run unprepared (`persistent(false)`): Postgres then plans each
// with its parameters. A cached statement turns generic after five runs, and a generic
// plan cannot use the per-user GIN index for a tsquery built inside the statement, nor
// the (user_id, at) index under an optional as-of cut: at 100,000 messages the BM25
// statement went from under a millisecond to 296 ms, the newest-message lookup to 73 ms.
