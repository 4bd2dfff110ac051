//! Prometheus metrics. Counters and histograms are observed in-process as turns finish;
//! queue depth is read from Postgres at scrape time, so it is the same from any process.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use sqlx::PgPool;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabel {
    state: String,
    lane: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LookupLabel {
    cache: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CacheLabel {
    cache: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TableLabel {
    table: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StartLabel {
    start: String,
}

/// This process's metrics.
pub struct Metrics {
    registry: Registry,
    turns: Family<StatusLabel, Counter>,
    starts: Family<StartLabel, Counter>,
    latency_ms: Histogram,
    kv_bytes: Gauge,
    kv_bytes_saved: Counter,
    digest_rebuilds: Counter,
    reaped: Counter,
    commit_batch: Histogram,
    /// Sessions per batched decode (KVMEM_BATCH_SESSIONS > 1), lone turns included.
    decode_batch: Histogram,
    batched_turns: Counter,
    queue_depth: Family<QueueLabel, Gauge>,
    snapshot_cache: crate::snapshot::CacheCounters,
    snapshot_dir_bytes: Gauge,
    retention_rows: Family<TableLabel, Counter>,
    maintenance_runs: Family<ChoreLabel, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ChoreLabel {
    chore: String,
}

/// The process-wide metrics: what `kvmem worker` and `kvmem serve` count into and expose.
/// Tests give each worker and server a registry of their own ([`Metrics::new`]), so
/// parallel tests never see each other's counts.
pub fn global() -> Arc<Metrics> {
    static METRICS: OnceLock<Arc<Metrics>> = OnceLock::new();
    METRICS.get_or_init(|| Arc::new(Metrics::new())).clone()
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("kvmem");
        let m = Metrics {
            turns: Family::default(),
            starts: Family::default(),
            latency_ms: Histogram::new(exponential_buckets(5.0, 2.0, 14)),
            kv_bytes: Gauge::default(),
            kv_bytes_saved: Counter::default(),
            digest_rebuilds: Counter::default(),
            reaped: Counter::default(),
            commit_batch: Histogram::new(exponential_buckets(1.0, 2.0, 10)),
            decode_batch: Histogram::new(exponential_buckets(1.0, 2.0, 10)),
            batched_turns: Counter::default(),
            queue_depth: Family::default(),
            snapshot_cache: crate::snapshot::CacheCounters::default(),
            snapshot_dir_bytes: Gauge::default(),
            retention_rows: Family::default(),
            maintenance_runs: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "turns",
            "Turn attempts finished, by status (OK, ERROR)",
            m.turns.clone(),
        );
        registry.register(
            "turn_starts",
            "Successful turns by start (warm, cold)",
            m.starts.clone(),
        );
        registry.register(
            "turn_latency_ms",
            "Turn latency in milliseconds",
            m.latency_ms.clone(),
        );
        registry.register(
            "kv_bytes",
            "KV state bytes of the last saved snapshot",
            m.kv_bytes.clone(),
        );
        registry.register(
            "kv_bytes_saved",
            "KV state bytes saved to snapshots",
            m.kv_bytes_saved.clone(),
        );
        registry.register(
            "digest_rebuilds",
            "Digest rebuilds that changed the version",
            m.digest_rebuilds.clone(),
        );
        registry.register(
            "reaper_requeued",
            "Turns the reaper took back from expired leases",
            m.reaped.clone(),
        );
        registry.register(
            "commit_batch_turns",
            "Completions per group-commit transaction",
            m.commit_batch.clone(),
        );
        registry.register(
            "decode_batch_sessions",
            "Sessions per engine run when KVMEM_BATCH_SESSIONS > 1 (1 = a turn that ran alone)",
            m.decode_batch.clone(),
        );
        registry.register(
            "batched_turns",
            "Turns decoded together with at least one other session",
            m.batched_turns.clone(),
        );
        registry.register(
            "queue_depth",
            "Turns by state and lane, read from Postgres at scrape",
            m.queue_depth.clone(),
        );
        registry.register(
            "snapshot_dir_bytes",
            "Bytes of the snapshot files in KVMEM_KV_DIR, as of the last storage sweep",
            m.snapshot_dir_bytes.clone(),
        );
        registry.register(
            "retention_rows_removed",
            "Rows deleted by retention, by table",
            m.retention_rows.clone(),
        );
        registry.register(
            "maintenance_runs",
            "Runs of each housekeeping chore (leases, trim, erased, storage)",
            m.maintenance_runs.clone(),
        );
        let cache = &m.snapshot_cache;
        for (name, help, counter) in [
            (
                "snapshot_cache_hits",
                "Snapshot loads served by a current copy in the local cache (object store mode)",
                &cache.hits,
            ),
            (
                "snapshot_cache_misses",
                "Snapshot loads that read the object store (nothing cached, or a stale copy)",
                &cache.misses,
            ),
            (
                "snapshot_cache_evictions",
                "Snapshot files deleted to stay under KVMEM_KV_CACHE_BYTES",
                &cache.evictions,
            ),
            (
                "snapshot_quarantine_removed",
                "Quarantined snapshot files and objects removed after KVMEM_KV_QUARANTINE_DAYS",
                &cache.quarantine_removed,
            ),
            (
                "snapshot_remote_errors",
                "Object store requests that failed or timed out",
                &cache.remote_errors,
            ),
        ] {
            registry.register(name, help, counter.clone());
        }
        register_summary_caches(&mut registry);
        Metrics { registry, ..m }
    }

    /// The snapshot cache's counters, for the store to count into.
    pub fn snapshot_cache(&self) -> crate::snapshot::CacheCounters {
        self.snapshot_cache.clone()
    }

    /// A finished attempt, as logged.
    pub fn turn(&self, log: &crate::turn::log::KvLog) {
        self.turns
            .get_or_create(&StatusLabel {
                status: log.status.to_string(),
            })
            .inc();
        if log.status != "OK" {
            return;
        }
        self.latency_ms.observe(log.latency_ms as f64);
        let start = if log.cold { "cold" } else { "warm" };
        self.starts
            .get_or_create(&StartLabel {
                start: start.into(),
            })
            .inc();
        if log.kv_bytes > 0 {
            self.kv_bytes.set(log.kv_bytes as i64);
            self.kv_bytes_saved.inc_by(log.kv_bytes);
        }
    }

    /// One storage sweep: the rows it deleted per table and the directory's bytes after.
    pub fn storage_swept(&self, rows: &[(&'static str, u64)], snapshot_bytes: Option<u64>) {
        for (table, n) in rows {
            self.retention_rows
                .get_or_create(&TableLabel {
                    table: table.to_string(),
                })
                .inc_by(*n);
        }
        if let Some(bytes) = snapshot_bytes {
            self.snapshot_dir_bytes.set(bytes as i64);
        }
    }

    /// One run of a housekeeping chore (`worker/maintenance/`).
    pub fn maintenance_ran(&self, chore: &str) {
        self.maintenance_runs
            .get_or_create(&ChoreLabel {
                chore: chore.to_string(),
            })
            .inc();
    }

    pub fn digest_rebuilt(&self) {
        self.digest_rebuilds.inc();
    }

    pub fn reaped(&self, n: usize) {
        self.reaped.inc_by(n as u64);
    }

    pub fn commit_batch(&self, n: usize) {
        self.commit_batch.observe(n as f64);
    }

    /// One engine run of `n` turns decoded together.
    pub fn decode_batch(&self, n: usize) {
        self.decode_batch.observe(n as f64);
        if n > 1 {
            self.batched_turns.inc_by(n as u64);
        }
    }

    /// Turns decoded together with another session, so far.
    pub fn batched_turns(&self) -> u64 {
        self.batched_turns.get()
    }

    /// Refreshes the queue gauges from Postgres and renders the text exposition format.
    pub async fn render(&self, pool: &PgPool) -> Result<String, sqlx::Error> {
        let rows: Vec<(String, String, i64)> =
            sqlx::query_as(include_str!("../sql/metrics/queue_stats.sql"))
                .fetch_all(pool)
                .await?;
        for (state, lane, n) in rows {
            self.queue_depth
                .get_or_create(&QueueLabel { state, lane })
                .set(n);
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .map_err(|e| sqlx::Error::Protocol(format!("metrics encoding: {e}")))?;
        Ok(out)
    }
}

/// Seed 004's summary caches live in every summary service of the process, so their
/// lookups are counted process-wide and every registry reports the same figures.
struct SummaryCaches {
    lookups: Family<LookupLabel, Counter>,
    hit_ratio: Family<CacheLabel, Gauge<f64, AtomicU64>>,
}

fn summary_caches() -> &'static SummaryCaches {
    static STATS: OnceLock<SummaryCaches> = OnceLock::new();
    STATS.get_or_init(|| SummaryCaches {
        lookups: Family::default(),
        hit_ratio: Family::default(),
    })
}

/// One lookup of summary cache `cache`, answered from `result` (memory, db or computed),
/// and that cache's refreshed hit ratio (memory or db over all lookups).
pub fn summary_cache_lookup(cache: &str, result: &str) {
    let s = summary_caches();
    let counter = |result: &str| {
        s.lookups
            .get_or_create(&LookupLabel {
                cache: cache.into(),
                result: result.into(),
            })
            .clone()
    };
    counter(result).inc();
    let hits = counter("memory").get() + counter("db").get();
    let all = hits + counter("computed").get();
    s.hit_ratio
        .get_or_create(&CacheLabel {
            cache: cache.into(),
        })
        .set(hits as f64 / all.max(1) as f64);
}

fn register_summary_caches(registry: &mut Registry) {
    let s = summary_caches();
    registry.register(
        "summary_cache_lookups",
        "Summary cache lookups by cache and where they were answered (memory, db, computed)",
        s.lookups.clone(),
    );
    registry.register(
        "summary_cache_hit_ratio",
        "Summary cache hits (memory or db) over lookups, by cache, this process",
        s.hit_ratio.clone(),
    );
}
