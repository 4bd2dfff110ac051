//! The byte cap on the snapshot directory: an LRU index of which scopes have a file there
//! and how large each is, whose evictions delete the file. It caps the cache in front of an
//! object store and, in local mode, the only copy: a snapshot is a cache of a dialogue the
//! database holds, so an evicted session costs one cold start, never a word.

use std::sync::Arc;

use moka::notification::RemovalCause;
use moka::policy::EvictionPolicy;
use prometheus_client::metrics::counter::Counter;

use super::files::FileStore;

/// The cache's counts, exposed in `/metrics` by whoever registers them.
#[derive(Debug, Clone, Default)]
pub struct CacheCounters {
    /// Loads served by a current snapshot in the local cache.
    pub hits: Counter,
    /// Loads that went to the object store (nothing cached, or the cached copy was stale).
    pub misses: Counter,
    /// Snapshot files deleted to stay under the byte cap.
    pub evictions: Counter,
    /// Object store requests that failed (unreachable, timed out, refused).
    pub remote_errors: Counter,
    /// Quarantined `.bad` files and objects removed after their retention.
    pub quarantine_removed: Counter,
}

/// Which scopes the directory holds and their sizes, in LRU order, under a byte cap. The
/// files stay the truth: a file the index lost is at worst kept a while longer, an entry
/// whose file is gone only weighs until it is evicted, and deleting a file a turn is
/// reading cannot corrupt it (the open file is read whole; a later load finds it Missing).
#[derive(Clone)]
pub(super) struct Index {
    entries: moka::sync::Cache<String, u32>,
}

impl Index {
    /// An index capped at `cap` bytes over `files`, seeded from the files already there,
    /// oldest first so they leave first; over the cap, the oldest go now.
    pub(super) fn new(files: &FileStore, cap: u64, counters: &CacheCounters) -> Index {
        let evict = (files.clone(), counters.evictions.clone());
        let entries = moka::sync::Cache::builder()
            .max_capacity(cap)
            .weigher(|_: &String, bytes: &u32| *bytes)
            .eviction_policy(EvictionPolicy::lru())
            .eviction_listener(move |scope: Arc<String>, _, cause| {
                if cause == RemovalCause::Size {
                    if let Err(e) = evict.0.remove(&scope) {
                        tracing::warn!(error = %e, %scope, "could not delete an evicted snapshot");
                    }
                    evict.1.inc();
                }
            })
            .build();
        let index = Index { entries };
        index.learn(files);
        index
    }

    /// Indexes the files the index does not know yet (left by an earlier run, or written by
    /// another worker sharing the directory), oldest first, and forgets entries whose file
    /// is gone (another worker evicted or erased it); then runs the evictions that are due.
    /// Returns the bytes held after.
    pub(super) fn learn(&self, files: &FileStore) -> u64 {
        match files.list() {
            Ok(found) => {
                let on_disk: std::collections::HashSet<&str> =
                    found.iter().map(|(s, _)| s.as_str()).collect();
                let gone: Vec<Arc<String>> = self
                    .entries
                    .iter()
                    .map(|(scope, _)| scope)
                    .filter(|scope| !on_disk.contains(scope.as_str()))
                    .collect();
                for scope in gone {
                    self.entries.invalidate(scope.as_str());
                }
                for (scope, len) in &found {
                    if !self.entries.contains_key(scope) {
                        self.entries.insert(scope.clone(), weight(*len));
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, dir = %files.dir().display(), "could not list snapshot files")
            }
        }
        self.held()
    }

    /// A scope was read: touch its place in the LRU order, indexing it again if its insert
    /// raced an eviction.
    pub(super) fn touch(&self, scope: &str, len: u64) {
        if self.entries.get(scope).is_none() {
            self.entries.insert(scope.to_string(), weight(len));
        }
    }

    /// A scope's file was written: record its size and run the evictions it makes due, so
    /// the directory is back under the cap when the save returns.
    pub(super) fn put(&self, scope: &str, len: u64) {
        self.entries.insert(scope.to_string(), weight(len));
        self.entries.run_pending_tasks();
    }

    /// A scope's file was removed by other means (quarantine, erasure): no eviction counted.
    pub(super) fn forget(&self, scope: &str) {
        self.entries.invalidate(scope);
    }

    /// Runs the pending evictions; the bytes the index holds after.
    pub(super) fn held(&self) -> u64 {
        self.entries.run_pending_tasks();
        self.entries.weighted_size()
    }
}

/// A snapshot's weight in the index; one larger than 4 GiB counts as 4 GiB.
fn weight(len: u64) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}
