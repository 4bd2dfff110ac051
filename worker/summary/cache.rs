//! Seed 004's caches, on moka: the current day under a 1-hour TTL keyed by hour bucket,
//! past days and days 2–7 summaries in size-bounded LRUs keyed by immutable dates, and the
//! final merge keyed by the content hashes of its three inputs. Every lookup is counted by
//! where it was answered (memory, Postgres, computed) and the hit rates go to `/metrics`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::NaiveDate;
use moka::sync::Cache;
use serde::Serialize;

/// user id → that user's summary for one day.
pub type DayMap = BTreeMap<String, String>;

/// Seed 004's current-day TTL.
pub const CURRENT_DAY_TTL: Duration = Duration::from_secs(3600);

/// (scope, "YYYY-MM-DD-HH").
pub type CurrentDayKey = (String, String);
/// (scope, date).
pub type DayKey = (String, NaiveDate);
/// (scope, user, historical end date = yesterday).
pub type HistoricalKey = (String, String, NaiveDate);
/// (scope, user, hash(facts), hash(current day), hash(historical)).
pub type MergeKey = (String, String, String, String, String);

/// The four caches of seed 004's design.
pub struct Caches {
    pub current_day: Cache<CurrentDayKey, Arc<DayMap>>,
    pub past_days: Cache<DayKey, Arc<DayMap>>,
    pub historical: Cache<HistoricalKey, Arc<String>>,
    pub merged: Cache<MergeKey, Arc<String>>,
}

impl Caches {
    pub fn new(capacity: u64) -> Caches {
        Caches {
            current_day: Cache::builder()
                .max_capacity(capacity)
                .time_to_live(CURRENT_DAY_TTL)
                .build(),
            past_days: Cache::new(capacity),
            historical: Cache::new(capacity),
            merged: Cache::new(capacity),
        }
    }
}

/// Where a lookup was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// This process's moka cache.
    Memory,
    /// Postgres: another worker, or this one before a restart, made it.
    Db,
    /// Made now by the model (or trivially, for an empty input).
    Computed,
}

impl Source {
    fn as_str(self) -> &'static str {
        match self {
            Source::Memory => "memory",
            Source::Db => "db",
            Source::Computed => "computed",
        }
    }
}

/// Counts one lookup of `cache` by where it was answered; `/metrics` shows the counts and
/// hit ratios ([`crate::metrics::summary_cache_lookup`]).
pub fn record(cache: &str, source: Source) {
    crate::metrics::summary_cache_lookup(cache, source.as_str());
}

/// A short content hash for merge keys.
pub fn content_hash(text: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(&Sha256::digest(text.as_bytes())[..8])
}
