//! Where snapshots live: the snapshot files on local disk by default, or an object store
//! (S3-compatible, [`super::remote`]) with those files as a cache in front of it, so a
//! session's turn can land on any worker of a fleet and still resume warm. Either way the
//! directory is capped by bytes ([`super::cache`]). Only bytes move here: every check of the
//! format and of the pipeline is the same for both.

use std::collections::HashMap;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use object_store::PutPayload;

pub use super::cache::CacheCounters;
use super::cache::Index;
use super::files::{verify, FileStore, Loaded};
use super::format::{Header, Limits, SnapshotError, MAX_HEADER_BYTES};
use super::remote::Remote;
pub use super::remote::{RemoteConfig, RemoteError};

/// The snapshot store: local files, or an object store behind a local cache.
#[derive(Clone)]
pub struct SnapshotStore {
    files: FileStore,
    /// The directory's byte cap; none when uncapped (local mode with a cap of 0).
    index: Option<Index>,
    remote: Option<Arc<Remote>>,
    counters: CacheCounters,
}

/// What erasing one scope's snapshots removed, per store.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ScopeErased {
    /// The scope's snapshot file in the local directory (0 or 1).
    pub files: u64,
    /// Its quarantined `<scope>.<millis>.bad` copies in the local directory.
    pub quarantined: u64,
    /// Its object and quarantined objects in the object store.
    pub objects: u64,
    /// The bytes of everything above.
    pub bytes: u64,
}

/// What one quarantine sweep removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct QuarantineSwept {
    pub files: u64,
    pub objects: u64,
    pub bytes: u64,
}

/// Where a snapshot was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The snapshot files, with no object store.
    Local,
    /// This worker's cache in front of the object store.
    Cache,
    /// The object store itself.
    Remote,
}

impl Source {
    /// The name `turn_log.kv_source` records.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Local => "local",
            Source::Cache => "cache",
            Source::Remote => "remote",
        }
    }
}

/// What a turn found before it knew whether the snapshot is current: see
/// [`SnapshotStore::read`] and [`SnapshotStore::resolve`].
#[derive(Debug)]
pub struct Read {
    loaded: Loaded,
}

impl std::fmt::Debug for SnapshotStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotStore")
            .field("dir", &self.files.dir())
            .field("remote", &self.remote.as_ref().map(|r| r.url.as_str()))
            .finish()
    }
}

impl SnapshotStore {
    /// Snapshot files in `dir` and nothing else (the default), the directory capped at
    /// `cap` bytes by evicting the least recently used (0: no cap).
    pub fn local(
        dir: impl Into<PathBuf>,
        limits: Limits,
        cap: u64,
        counters: CacheCounters,
    ) -> SnapshotStore {
        let files = FileStore::new(dir, limits);
        let index = (cap > 0).then(|| Index::new(&files, cap, &counters));
        SnapshotStore {
            files,
            index,
            remote: None,
            counters,
        }
    }

    /// An object store with `dir` as its local cache, capped at `cap` bytes. Nothing is
    /// contacted yet: an unreachable store shows at the first load or save, as a cold
    /// turn, never here.
    pub fn remote(
        dir: impl Into<PathBuf>,
        limits: Limits,
        config: &RemoteConfig,
        cap: u64,
        counters: CacheCounters,
    ) -> Result<SnapshotStore, RemoteError> {
        let remote = Remote::connect(config, counters.clone())?;
        let files = FileStore::new(dir, limits);
        let index = Index::new(&files, cap, &counters);
        Ok(SnapshotStore {
            files,
            index: Some(index),
            remote: Some(Arc::new(remote)),
            counters,
        })
    }

    /// The local directory: every snapshot without an object store, the cache with one.
    pub fn files(&self) -> &FileStore {
        &self.files
    }

    /// The object store's URL, when there is one.
    pub fn remote_url(&self) -> Option<&str> {
        self.remote.as_ref().map(|r| r.url.as_str())
    }

    /// The local copy, read off the runtime. Half of a load: it needs nothing from the
    /// database, so it runs while the turn's other inputs are read; [`resolve`](Self::resolve)
    /// finishes it once the session's last committed turn is known.
    pub async fn read(&self, scope: &str) -> Read {
        let files = self.files.clone();
        let scope_owned = scope.to_string();
        let loaded = tokio::task::spawn_blocking(move || files.load(&scope_owned))
            .await
            .unwrap_or_else(|e| Loaded::Unreadable(format!("snapshot load panicked: {e}")));
        if let (Some(index), Loaded::Found(snap)) = (&self.index, &loaded) {
            index.touch(scope, snap.state.len() as u64);
        }
        Read { loaded }
    }

    /// A scope's snapshot header, for a report such as the rotate hint: from the object
    /// store when there is one (it holds the latest turn's snapshot, where the cache may
    /// hold an older one or none), else from the local file. Only the header's bytes are
    /// read, nothing is cached, and cache hits and misses are not counted. None when there
    /// is no snapshot or its header does not parse (the next turn quarantines it).
    pub async fn header(&self, scope: &str) -> io::Result<Option<Header>> {
        let bytes = match &self.remote {
            Some(remote) => {
                let got = remote.within(remote.prefix(scope, MAX_HEADER_BYTES as u64));
                match got.await? {
                    Some(bytes) => bytes.to_vec(),
                    None => return Ok(None),
                }
            }
            None => {
                let path = self.files.path(scope);
                let read = tokio::task::spawn_blocking(move || read_prefix(&path));
                match read.await.map_err(io::Error::other)? {
                    Ok(bytes) => bytes,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                    Err(e) => return Err(e),
                }
            }
        };
        // Loose: a report reads a snapshot written under other limits too.
        let parsed = super::format::parse_header(&bytes, Limits::LOOSE);
        Ok(parsed.ok().map(|(header, _)| header))
    }

    /// The snapshot to check: the local copy when there is no object store, or when
    /// `current` accepts its header (a cache hit); else the object store's (a miss), which
    /// then replaces the cached copy. A local copy `current` refuses is not the latest when
    /// another worker ran the session's last turn.
    pub async fn resolve(
        &self,
        scope: &str,
        read: Read,
        current: impl Fn(&Header) -> bool,
    ) -> (Loaded, Source) {
        let Some(remote) = &self.remote else {
            return (read.loaded, Source::Local);
        };
        if let Loaded::Found(snap) = &read.loaded {
            if current(&snap.header) {
                remote.counters.hits.inc();
                return (read.loaded, Source::Cache);
            }
        }
        if let Loaded::Corrupt { error, quarantined } = &read.loaded {
            tracing::warn!(%error, ?quarantined, "cached snapshot corrupt; reading the object store");
        }
        remote.counters.misses.inc();
        (self.fetch(remote, scope).await, Source::Remote)
    }

    async fn fetch(&self, remote: &Remote, scope: &str) -> Loaded {
        let path = remote.path(scope);
        let max_len = self.files.max_len();
        let got = tokio::time::timeout(remote.timeout, async {
            let got = remote.store.get(&path).await?;
            if got.meta.size > max_len {
                return Ok(Err(SnapshotError::Limit {
                    field: "object size",
                    value: got.meta.size,
                    limit: max_len,
                }));
            }
            got.bytes().await.map(Ok)
        })
        .await;
        let bytes = match got {
            Ok(Ok(Ok(bytes))) => bytes,
            Ok(Ok(Err(error))) => return self.quarantine_remote(scope, error).await,
            Ok(Err(object_store::Error::NotFound { .. })) => return Loaded::Missing,
            Ok(Err(e)) => {
                remote.counters.remote_errors.inc();
                return Loaded::Unreadable(format!("object store {}: {e}", remote.url));
            }
            Err(_) => {
                remote.counters.remote_errors.inc();
                return Loaded::Unreadable(format!(
                    "object store {}: no answer in {} ms",
                    remote.url,
                    remote.timeout.as_millis()
                ));
            }
        };
        match verify(&bytes, scope, self.files.limits()) {
            Ok(snap) => {
                // Filling the cache is off the turn's path: the snapshot is in hand. Should
                // the fill land after this turn's own save, the cache holds an older turn,
                // which the next read finds stale and replaces from the bucket: a miss,
                // never a wrong resume.
                let (files, scope) = (self.files.clone(), scope.to_string());
                let index = self.index.clone();
                tokio::task::spawn_blocking(move || match files.save(&scope, &bytes) {
                    Ok(len) => index.iter().for_each(|i| i.put(&scope, len)),
                    Err(e) => tracing::warn!(error = %e, "could not cache a fetched snapshot"),
                });
                Loaded::Found(Box::new(snap))
            }
            Err(error) => self.quarantine_remote(scope, error).await,
        }
    }

    /// A damaged object is moved aside under `quarantine/`, never deleted, and so is any
    /// cached copy.
    async fn quarantine_remote(&self, scope: &str, error: SnapshotError) -> Loaded {
        Loaded::Corrupt {
            error,
            quarantined: self.quarantine(scope).await,
        }
    }

    /// Writes a snapshot: to the local directory, and with an object store to it as well
    /// (write-through), both before this returns, so a completed turn's snapshot is durable
    /// where any worker can read it. `at` is the fault seam of [`FileStore::save_with`].
    pub async fn save(&self, scope: &str, file: Vec<u8>, at: fn(&str)) -> io::Result<u64> {
        let file = bytes::Bytes::from(file);
        let local = {
            let (files, scope, file) = (self.files.clone(), scope.to_string(), file.clone());
            tokio::task::spawn_blocking(move || files.save_with(&scope, &file, &at))
        };
        let Some(remote) = &self.remote else {
            let len = local.await.map_err(io::Error::other)??;
            if let Some(index) = &self.index {
                index.put(scope, len);
            }
            return Ok(len);
        };
        let put = async {
            let path = remote.path(scope);
            match tokio::time::timeout(
                remote.timeout,
                remote.store.put(&path, PutPayload::from(file.clone())),
            )
            .await
            {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(format!("object store {}: {e}", remote.url)),
                Err(_) => Err(format!(
                    "object store {}: no answer in {} ms",
                    remote.url,
                    remote.timeout.as_millis()
                )),
            }
        };
        let (local, put) = tokio::join!(local, put);
        let len = local.map_err(io::Error::other)??;
        if let Some(index) = &self.index {
            index.put(scope, len);
        }
        put.map_err(|e| {
            remote.counters.remote_errors.inc();
            io::Error::other(e)
        })?;
        Ok(len)
    }

    /// Moves a scope's snapshot aside everywhere it is (never deletes it); returns where
    /// it went.
    pub async fn quarantine(&self, scope: &str) -> Option<String> {
        let files = self.files.clone();
        let scope_owned = scope.to_string();
        let local = tokio::task::spawn_blocking(move || files.quarantine(&scope_owned))
            .await
            .ok()
            .flatten()
            .map(|p| p.display().to_string());
        if let Some(index) = &self.index {
            index.forget(scope);
        }
        let Some(remote) = &self.remote else {
            return local;
        };
        let from = remote.path(scope);
        let to = remote.quarantine_path(scope);
        let moved = tokio::time::timeout(remote.timeout, async {
            remote.store.copy(&from, &to).await?;
            remote.store.delete(&from).await
        })
        .await;
        match moved {
            Ok(Ok(())) => Some(format!("{}/{}", remote.bucket_url(), to)),
            Ok(Err(object_store::Error::NotFound { .. })) => local,
            Ok(Err(e)) => {
                remote.counters.remote_errors.inc();
                tracing::warn!(error = %e, "could not quarantine the remote snapshot");
                local
            }
            Err(_) => {
                remote.counters.remote_errors.inc();
                local
            }
        }
    }

    /// Runs the cap's pending evictions now (they otherwise run as the index is used);
    /// returns the bytes it holds after (0 when uncapped).
    pub fn settle_cache(&self) -> u64 {
        self.index.as_ref().map_or(0, Index::held)
    }

    /// Brings the cap's index in line with the directory (files another worker sharing it
    /// wrote or removed) and evicts what is over the cap; returns the bytes the directory's
    /// snapshots hold after (listed, when there is no cap).
    pub fn reconcile(&self) -> u64 {
        match &self.index {
            Some(index) => index.learn(&self.files),
            None => self
                .files
                .list()
                .map(|found| found.iter().map(|(_, len)| len).sum())
                .unwrap_or(0),
        }
    }

    /// The store's counters (evictions, quarantine removals, object store figures).
    pub fn counters(&self) -> &CacheCounters {
        &self.counters
    }

    /// Deletes a scope's snapshot file, its quarantined `<scope>.<millis>.bad` copies,
    /// and with an object store its object and its `quarantine/<scope>.*.bad` objects;
    /// drops it from the cache index. Idempotent: a second call removes nothing.
    pub async fn erase(&self, scope: &str) -> io::Result<ScopeErased> {
        let files = self.files.clone();
        let owned = scope.to_string();
        let (files, quarantined, bytes) = tokio::task::spawn_blocking(move || files.erase(&owned))
            .await
            .map_err(io::Error::other)??;
        if let Some(index) = &self.index {
            index.forget(scope);
        }
        let mut erased = ScopeErased {
            files,
            quarantined,
            objects: 0,
            bytes,
        };
        if let Some(remote) = &self.remote {
            let (objects, bytes) = remote.within(remote.erase(scope)).await?;
            erased.objects = objects;
            erased.bytes += bytes;
        }
        Ok(erased)
    }

    /// Erases, for each scope, what was written before the time it was erased (Unix
    /// milliseconds) and nothing newer: the maintenance sweep's erase, which must not
    /// remove the snapshot of a session id used again after its erase.
    pub async fn erase_written_before(
        &self,
        erased: HashMap<String, u64>,
    ) -> io::Result<ScopeErased> {
        let files = self.files.clone();
        let (erased, (files, quarantined, bytes)) = tokio::task::spawn_blocking(move || {
            let r = files.erase_written_before(&erased);
            r.map(|r| (erased, r))
        })
        .await
        .map_err(io::Error::other)??;
        if let Some(index) = &self.index {
            for scope in erased.keys() {
                if !self.files.path(scope).exists() {
                    index.forget(scope);
                }
            }
        }
        let mut swept = ScopeErased {
            files,
            quarantined,
            objects: 0,
            bytes,
        };
        if let Some(remote) = &self.remote {
            // A bounded batch per request deadline: a first sweep may hold thousands.
            let all: Vec<(&String, &u64)> = erased.iter().collect();
            for chunk in all.chunks(64) {
                let (objects, bytes) = remote.within(remote.erase_written_before(chunk)).await?;
                swept.objects += objects;
                swept.bytes += bytes;
            }
            let (objects, bytes) = remote
                .within(
                    remote
                        .delete_quarantined(|s, stamp| erased.get(s).is_some_and(|at| stamp < *at)),
                )
                .await?;
            swept.objects += objects;
            swept.bytes += bytes;
        }
        Ok(swept)
    }

    /// Deletes quarantined copies moved aside more than `max_age` ago, in the directory
    /// and under the object store's `quarantine/` prefix.
    pub async fn sweep_quarantine(&self, max_age: Duration) -> io::Result<QuarantineSwept> {
        let now = chrono::Utc::now().timestamp_millis().max(0) as u64;
        let before = now.saturating_sub(max_age.as_millis() as u64);
        let files = self.files.clone();
        let (removed, bytes) = tokio::task::spawn_blocking(move || files.sweep_quarantine(before))
            .await
            .map_err(io::Error::other)??;
        let mut swept = QuarantineSwept {
            files: removed,
            objects: 0,
            bytes,
        };
        if let Some(remote) = &self.remote {
            let (objects, bytes) = remote
                .within(remote.delete_quarantined(|_, at| at < before))
                .await?;
            swept.objects = objects;
            swept.bytes += bytes;
        }
        self.counters
            .quarantine_removed
            .inc_by(swept.files + swept.objects);
        Ok(swept)
    }
}

/// A file's first [`MAX_HEADER_BYTES`] bytes: all a header can take.
fn read_prefix(path: &std::path::Path) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_HEADER_BYTES as u64)
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}
