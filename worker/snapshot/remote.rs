//! The object store behind the snapshot directory (S3-compatible, through `object_store`):
//! how it is reached, where a scope's object and its quarantined copies are, and the
//! requests that remove them, each under the store's timeout.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{ClientOptions, ObjectStore, RetryConfig};

use super::cache::CacheCounters;
use super::files::parse_quarantined;

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
}

pub(super) struct Remote {
    pub(super) store: Arc<dyn ObjectStore>,
    /// `s3://bucket/prefix`, for logs and quarantine reports.
    pub(super) url: String,
    prefix: String,
    pub(super) timeout: Duration,
    pub(super) counters: CacheCounters,
}

/// The object store the settings name could not be set up (a bad endpoint or region).
#[derive(Debug, thiserror::Error)]
#[error("object store s3://{bucket}: {error}")]
pub struct RemoteError {
    bucket: String,
    error: object_store::Error,
}

impl Remote {
    /// The S3 client `config` describes; nothing is contacted yet.
    pub(super) fn connect(
        config: &RemoteConfig,
        counters: CacheCounters,
    ) -> Result<Remote, RemoteError> {
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
        let prefix = config.prefix.trim_matches('/').to_string();
        let url = format!("s3://{}", config.bucket);
        Ok(Remote {
            store: Arc::new(store),
            url: if prefix.is_empty() {
                url
            } else {
                format!("{url}/{prefix}")
            },
            prefix,
            timeout: config.timeout,
            counters,
        })
    }

    /// Runs an object store request under the store's timeout; a failure is counted.
    pub(super) async fn within<T>(
        &self,
        work: impl std::future::Future<Output = Result<T, object_store::Error>>,
    ) -> io::Result<T> {
        let failed = match tokio::time::timeout(self.timeout, work).await {
            Ok(Ok(done)) => return Ok(done),
            Ok(Err(e)) => format!("object store {}: {e}", self.url),
            Err(_) => format!(
                "object store {}: no answer in {} ms",
                self.url,
                self.timeout.as_millis()
            ),
        };
        self.counters.remote_errors.inc();
        Err(io::Error::other(failed))
    }

    /// The first `len` bytes of a scope's object (all of it when shorter); None when
    /// there is none.
    pub(super) async fn prefix(
        &self,
        scope: &str,
        len: u64,
    ) -> Result<Option<bytes::Bytes>, object_store::Error> {
        let path = self.path(scope);
        let size = match self.store.head(&path).await {
            Ok(meta) => meta.size,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        match self.store.get_range(&path, 0..size.min(len)).await {
            Ok(bytes) => Ok(Some(bytes)),
            // Erased between the two requests.
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Deletes a scope's object and its quarantined objects: (objects, bytes) removed.
    pub(super) async fn erase(&self, scope: &str) -> Result<(u64, u64), object_store::Error> {
        let path = self.path(scope);
        let (mut objects, mut bytes) = match self.store.head(&path).await {
            Ok(meta) => {
                self.store.delete(&path).await?;
                (1, meta.size)
            }
            Err(object_store::Error::NotFound { .. }) => (0, 0),
            Err(e) => return Err(e),
        };
        let (n, b) = self.delete_quarantined(|s, _| s == scope).await?;
        objects += n;
        bytes += b;
        Ok((objects, bytes))
    }

    /// The sweep's erase of some scopes' objects: each one last written before the time its
    /// scope was erased (Unix milliseconds), never a newer one. Returns (objects, bytes).
    pub(super) async fn erase_written_before(
        &self,
        erased: &[(&String, &u64)],
    ) -> Result<(u64, u64), object_store::Error> {
        let (mut objects, mut bytes) = (0, 0);
        for (scope, at) in erased {
            let path = self.path(scope);
            let meta = match self.store.head(&path).await {
                Ok(meta) => meta,
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(e) => return Err(e),
            };
            if (meta.last_modified.timestamp_millis().max(0) as u64) < **at {
                match self.store.delete(&path).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {
                        objects += 1;
                        bytes += meta.size;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok((objects, bytes))
    }

    /// Deletes the objects under `quarantine/` whose scope and stamp `pick` accepts:
    /// (objects, bytes) removed. Quarantine is rare, so one listing of it is cheap.
    pub(super) async fn delete_quarantined(
        &self,
        pick: impl Fn(&str, u64) -> bool,
    ) -> Result<(u64, u64), object_store::Error> {
        use futures_util::TryStreamExt;
        let under = ObjectPath::from(self.key("quarantine"));
        let found: Vec<object_store::ObjectMeta> =
            self.store.list(Some(&under)).try_collect().await?;
        let (mut objects, mut bytes) = (0, 0);
        for meta in found {
            let name = meta.location.filename().unwrap_or_default();
            let Some((scope, at)) = parse_quarantined(name) else {
                continue;
            };
            if !pick(scope, at) {
                continue;
            }
            match self.store.delete(&meta.location).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {
                    objects += 1;
                    bytes += meta.size;
                }
                Err(e) => return Err(e),
            }
        }
        Ok((objects, bytes))
    }

    pub(super) fn path(&self, scope: &str) -> ObjectPath {
        ObjectPath::from(self.key(&format!("{scope}.llkv")))
    }

    pub(super) fn quarantine_path(&self, scope: &str) -> ObjectPath {
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

    pub(super) fn bucket_url(&self) -> &str {
        match self.url.strip_suffix(&format!("/{}", self.prefix)) {
            Some(bucket) if !self.prefix.is_empty() => bucket,
            _ => &self.url,
        }
    }
}
