//! Where snapshots live: the snapshot files on local disk by default, or an object store
//! (S3-compatible, through `object_store`) with those files as a byte-capped LRU cache in
//! front of it, so a session's turn can land on any worker of a fleet and still resume warm.
//! Only bytes move here: every check of the format and of the pipeline is the same for both.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use moka::notification::RemovalCause;
use moka::policy::EvictionPolicy;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{ClientOptions, ObjectStore, PutPayload, RetryConfig};
use prometheus_client::metrics::counter::Counter;

use super::files::{verify, FileStore, Loaded};
use super::format::{Header, Limits, SnapshotError};

/// Where an object store is and how to reach it.
#[derive(Debug, Clone)]
pub struct RemoteConfig {
    /// `http://host:port` for an S3-compatible server; unset = AWS itself.
    pub endpoint: Option<String>,
    pub bucket: String,
    pub region: String,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    /// Key prefix: snapshots are `<prefix>/<scope>.llkv`.
    pub prefix: String,
    /// Bound on one request, retries included: an unreachable store costs a turn this long,
    /// and then it runs cold.
    pub timeout: Duration,
    /// The local cache's size cap in bytes.
    pub cache_bytes: u64,
}

/// The cache's counts, exposed in `/metrics` by whoever registers them.
#[derive(Debug, Clone, Default)]
pub struct CacheCounters {
    /// Loads served by a current snapshot in the local cache.
    pub hits: Counter,
    /// Loads that went to the object store (nothing cached, or the cached copy was stale).
    pub misses: Counter,
    /// Cached snapshots deleted to stay under the byte cap.
    pub evictions: Counter,
    /// Object store requests that failed (unreachable, timed out, refused).
    pub remote_errors: Counter,
}

/// The snapshot store: local files, or an object store behind a local cache.
#[derive(Clone)]
pub struct SnapshotStore {
    files: FileStore,
    remote: Option<Arc<Remote>>,
}

struct Remote {
    store: Arc<dyn ObjectStore>,
    /// `s3://bucket/prefix`, for logs and quarantine reports.
    url: String,
    prefix: String,
    timeout: Duration,
    /// Which scopes the cache directory holds and their sizes, in LRU order; evicting one
    /// deletes its file. The files themselves stay the truth: a file the index lost is only
    /// a miss.
    index: moka::sync::Cache<String, u32>,
    counters: CacheCounters,
}

/// The object store the settings name could not be set up (a bad endpoint or region).
#[derive(Debug, thiserror::Error)]
#[error("object store s3://{bucket}: {error}")]
pub struct RemoteError {
    bucket: String,
    error: object_store::Error,
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
    /// Snapshot files in `dir` and nothing else (the default).
    pub fn local(dir: impl Into<PathBuf>, limits: Limits) -> SnapshotStore {
        SnapshotStore {
            files: FileStore::new(dir, limits),
            remote: None,
        }
    }

    /// An object store with `dir` as its local cache. Nothing is contacted yet: an
    /// unreachable store shows at the first load or save, as a cold turn, never here.
    pub fn remote(
        dir: impl Into<PathBuf>,
        limits: Limits,
        config: &RemoteConfig,
        counters: CacheCounters,
    ) -> Result<SnapshotStore, RemoteError> {
        let mut builder = AmazonS3Builder::new()
            .with_bucket_name(&config.bucket)
            .with_region(&config.region)
            .with_retry(RetryConfig {
                max_retries: 2,
                retry_timeout: config.timeout,
                ..RetryConfig::default()
            })
            .with_client_options(
                ClientOptions::new()
                    .with_timeout(config.timeout)
                    .with_connect_timeout(config.timeout.min(Duration::from_secs(2)))
                    .with_allow_http(
                        config
                            .endpoint
                            .as_deref()
                            .is_some_and(|e| e.starts_with("http://")),
                    ),
            );
        if let Some(endpoint) = &config.endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        if let (Some(id), Some(secret)) = (&config.access_key_id, &config.secret_access_key) {
            builder = builder
                .with_access_key_id(id)
                .with_secret_access_key(secret);
        }
        let store = builder.build().map_err(|e| RemoteError {
            bucket: config.bucket.clone(),
            error: e,
        })?;
        Ok(Self::over(
            dir,
            limits,
            Arc::new(store),
            format!("s3://{}", config.bucket),
            config,
            counters,
        ))
    }

    /// The cache over any `ObjectStore`; [`remote`](Self::remote) builds the S3 one.
    fn over(
        dir: impl Into<PathBuf>,
        limits: Limits,
        store: Arc<dyn ObjectStore>,
        url: String,
        config: &RemoteConfig,
        counters: CacheCounters,
    ) -> SnapshotStore {
        let files = FileStore::new(dir, limits);
        let evict = (files.clone(), counters.evictions.clone());
        let index = moka::sync::Cache::builder()
            .max_capacity(config.cache_bytes)
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
        // Files left by an earlier run are the cache's start, oldest first so they leave
        // first; over the cap, the oldest go now.
        match files.list() {
            Ok(found) => {
                for (scope, len) in found {
                    index.insert(scope, weight(len));
                }
                index.run_pending_tasks();
            }
            Err(e) => {
                tracing::warn!(error = %e, dir = %files.dir().display(), "could not list cached snapshots")
            }
        }
        let prefix = config.prefix.trim_matches('/').to_string();
        SnapshotStore {
            files,
            remote: Some(Arc::new(Remote {
                store,
                url: if prefix.is_empty() {
                    url
                } else {
                    format!("{url}/{prefix}")
                },
                prefix,
                timeout: config.timeout,
                index,
                counters,
            })),
        }
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
        if let Some(remote) = &self.remote {
            // Touch the LRU order; a file the index does not know (its insert raced an
            // eviction) is indexed again.
            if let Loaded::Found(snap) = &loaded {
                if remote.index.get(scope).is_none() {
                    remote
                        .index
                        .insert(scope.to_string(), weight(snap.state.len() as u64));
                }
            }
        }
        Read { loaded }
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
                let index = remote.index.clone();
                tokio::task::spawn_blocking(move || match files.save(&scope, &bytes) {
                    Ok(len) => index.insert(scope, weight(len)),
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
            return local.await.map_err(io::Error::other)?;
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
        remote.index.insert(scope.to_string(), weight(len));
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
        let Some(remote) = &self.remote else {
            return local;
        };
        remote.index.invalidate(scope);
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

    /// Runs the cache's pending evictions now (they otherwise run as the cache is used);
    /// returns the bytes it holds after.
    pub fn settle_cache(&self) -> u64 {
        match &self.remote {
            Some(remote) => {
                remote.index.run_pending_tasks();
                remote.index.weighted_size()
            }
            None => 0,
        }
    }
}

impl Remote {
    fn path(&self, scope: &str) -> ObjectPath {
        ObjectPath::from(self.key(&format!("{scope}.llkv")))
    }

    fn quarantine_path(&self, scope: &str) -> ObjectPath {
        let stamp = chrono::Utc::now().timestamp_millis();
        ObjectPath::from(self.key(&format!("quarantine/{scope}.{stamp}.bad")))
    }

    fn key(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}/{name}", self.prefix)
        }
    }

    fn bucket_url(&self) -> &str {
        match self.url.strip_suffix(&format!("/{}", self.prefix)) {
            Some(bucket) if !self.prefix.is_empty() => bucket,
            _ => &self.url,
        }
    }
}

/// A snapshot's weight in the cache; one larger than 4 GiB counts as 4 GiB.
fn weight(len: u64) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}
