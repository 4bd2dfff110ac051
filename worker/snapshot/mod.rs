//! KV snapshots: the LLKV1 byte format ([`format`], the only file the fuzz crate compiles)
//! and where the files live ([`store`]). The pipeline decides when a snapshot is trusted;
//! this module only guarantees that a damaged or foreign file is never read as a good one.

pub mod format;
pub mod store;

pub use format::{
    decode, encode, parse_header, parse_segments, render_segments, Compression, Header, Limits,
    SegKind, Segment, Snapshot, SnapshotError, FORMAT_VERSION, MAGIC,
};
pub use store::{scope_key, Loaded, SnapshotStore};
