//! KV snapshots: the LLKV1 byte format ([`mod@format`], the only file the fuzz crate compiles)
//! and where they live: files on local disk ([`files`]), by themselves or as the cache in
//! front of an object store ([`store`]). The pipeline decides when a snapshot is trusted;
//! this module only guarantees that a damaged or foreign file is never read as a good one.

pub mod cache;
pub mod files;
pub mod format;
pub mod remote;
pub mod store;

pub use files::{scope_key, FileStore, Loaded};
pub use format::{
    decode, encode, parse_header, parse_segments, render_segments, Compression, Header, Limits,
    SegKind, Segment, Snapshot, SnapshotError, CPU_DEVICE, FORMAT_VERSION, MAGIC,
};
pub use store::{CacheCounters, QuarantineSwept, RemoteConfig, ScopeErased, SnapshotStore, Source};
