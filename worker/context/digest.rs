//! The digest: a session's world-state facts as a short canonical text whose SHA-256 is
//! its version. Same facts, same text, same version, whatever the insert order, process
//! or clock: that is what lets a turn skip re-injecting a digest the KV already holds.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sha2::{Digest as _, Sha256};
use sqlx::postgres::PgListener;
use sqlx::{PgPool, Row};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::context::tokens::TokenCount;
use crate::metrics::Metrics;

/// Channel the `facts` trigger notifies, payload = session id.
pub const FACTS_CHANNEL: &str = "kvmem_facts";

/// How a fact type is treated by the relevance gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Relevance {
    /// Conflicts, relationships, debts, quests, reputation, alliances, win/loss records:
    /// always in while active.
    Durable,
    /// Buffs, debuffs, alerts, rumors, timers: in only while unexpired.
    Ephemeral,
    /// Any other type: kept, but trimmed first when over budget.
    Unknown,
}

/// Classifies a fact type (case-insensitive, singular or plural).
pub fn relevance(fact_type: &str) -> Relevance {
    let t = fact_type.trim().to_ascii_lowercase();
    let t = t.strip_suffix('s').unwrap_or(&t);
    match t {
        "conflict" | "relationship" | "debt" | "quest" | "reputation" | "alliance" | "record"
        | "win_loss" | "win_loss_record" | "winloss" => Relevance::Durable,
        "buff" | "debuff" | "alert" | "rumor" | "timer" => Relevance::Ephemeral,
        _ => Relevance::Unknown,
    }
}

/// One active fact as read from the database.
#[derive(Debug, Clone)]
pub struct Fact {
    pub fact_type: String,
    pub value: String,
    pub expires_at: Option<DateTime<Utc>>,
}

/// A built digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Built {
    pub content: String,
    pub version: String,
    pub tokens: usize,
    pub fact_count: usize,
    pub next_expiry_at: Option<DateTime<Utc>>,
}

/// Collapses whitespace runs (newlines included) to one space and trims.
pub fn canonicalize(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `{Type}: {value}`, with the type's first letter capitalised and `_` read as a space.
pub fn render_line(fact_type: &str, value: &str) -> String {
    let t = canonicalize(&fact_type.replace('_', " "));
    let mut chars = t.chars();
    let label: String = match chars.next() {
        Some(c) => c.to_uppercase().chain(chars).collect(),
        None => String::new(),
    };
    canonicalize(&format!("{label}: {value}"))
}

/// SHA-256 of the canonical text, hex.
pub fn version_of(content: &str) -> String {
    hex::encode(Sha256::digest(content.as_bytes()))
}

/// Builds the digest from facts: gate, render, canonicalise, sort, trim to `max_tokens`
/// by priority (unknown types go first, then ephemeral, then durable; among equals the
/// last line in sort order goes first), hash. Timestamps and ids never enter the text.
pub fn build(facts: &[Fact], now: DateTime<Utc>, max_tokens: usize, tok: &dyn TokenCount) -> Built {
    let mut lines: Vec<(Relevance, String, Option<DateTime<Utc>>)> = facts
        .iter()
        .filter(|f| f.expires_at.is_none_or(|e| e > now))
        .map(|f| {
            (
                relevance(&f.fact_type),
                render_line(&f.fact_type, &f.value),
                f.expires_at,
            )
        })
        .filter(|(_, line, _)| !line.is_empty())
        .collect();
    lines.sort_by(|a, b| a.1.cmp(&b.1));
    lines.dedup_by(|a, b| a.1 == b.1);
    let mut content = join(&lines);
    let mut tokens = tok.count(&content);
    while tokens > max_tokens && !lines.is_empty() {
        let victim = lines
            .iter()
            .enumerate()
            .max_by(|(ia, a), (ib, b)| a.0.cmp(&b.0).then(ia.cmp(ib)))
            .map(|(i, _)| i)
            .expect("lines is not empty");
        lines.remove(victim);
        content = join(&lines);
        tokens = tok.count(&content);
    }
    Built {
        version: version_of(&content),
        tokens,
        fact_count: lines.len(),
        next_expiry_at: lines.iter().filter_map(|l| l.2).min(),
        content,
    }
}

fn join(lines: &[(Relevance, String, Option<DateTime<Utc>>)]) -> String {
    lines
        .iter()
        .map(|l| l.1.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The stored digest of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub version: String,
    pub content: String,
}

/// Reads the session's facts and builds its digest (no write).
pub async fn build_for(
    pool: &PgPool,
    session_id: &str,
    max_tokens: usize,
    tok: &dyn TokenCount,
) -> Result<Built, sqlx::Error> {
    let rows = sqlx::query(include_str!("../../sql/digest/active_facts.sql"))
        .bind(session_id)
        .fetch_all(pool)
        .await?;
    let facts = rows.iter().map(fact_of).collect::<Result<Vec<_>, _>>()?;
    Ok(build(&facts, Utc::now(), max_tokens, tok))
}

fn fact_of(row: &sqlx::postgres::PgRow) -> Result<Fact, sqlx::Error> {
    Ok(Fact {
        fact_type: row.try_get("type")?,
        value: row.try_get("value")?,
        expires_at: row.try_get("expires_at")?,
    })
}

/// Which of the sessions handed to [`rebuild_batch`] it rebuilds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// Only those whose dirty marker it could claim: a notification names a session, but
    /// another rebuilder may have rebuilt it already, or its write may still be in flight.
    Dirty,
    /// Every one: a turn needs its digest now, or an included fact expired.
    All,
}

/// One session's digest after a rebuild, and whether its stored row changed.
#[derive(Debug, Clone)]
pub struct Rebuilt {
    pub session_id: String,
    pub built: Built,
    pub changed: bool,
}

/// The most sessions one rebuild transaction takes, so it holds its locks briefly.
pub const MAX_BATCH: usize = 128;

/// Rebuilds and stores the digests of `sessions` in one transaction, so a batch costs one
/// read, one write and one commit however many sessions it holds.
pub async fn rebuild_batch(
    pool: &PgPool,
    sessions: &[String],
    pick: Pick,
    max_tokens: usize,
    tok: &dyn TokenCount,
    metrics: &Metrics,
) -> Result<Vec<Rebuilt>, sqlx::Error> {
    let mut sessions = sessions.to_vec();
    sessions.sort();
    sessions.dedup();
    // Scope: the markers claimed, the facts read and the digests (and events) written.
    let mut tx = pool.begin().await?;
    let claimed: Vec<String> = sqlx::query_scalar(include_str!("../../sql/digest/claim.sql"))
        .bind(&sessions)
        .fetch_all(&mut *tx)
        .await?;
    if pick == Pick::Dirty {
        sessions = claimed;
    }
    finish(tx, sessions, max_tokens, tok, metrics).await
}

/// Claims up to [`MAX_BATCH`] dirty markers of any sessions and rebuilds those sessions:
/// a polling rebuilder's step. Returns how many sessions it rebuilt.
pub async fn sweep(
    pool: &PgPool,
    max_tokens: usize,
    tok: &dyn TokenCount,
    metrics: &Metrics,
) -> Result<usize, sqlx::Error> {
    let any: bool = sqlx::query_scalar(include_str!("../../sql/digest/any_dirty.sql"))
        .fetch_one(pool)
        .await?;
    if !any {
        return Ok(0);
    }
    sweep_now(pool, max_tokens, tok, metrics).await
}

/// [`sweep`] without the look first: for a rebuilder whose last sweep found work.
async fn sweep_now(
    pool: &PgPool,
    max_tokens: usize,
    tok: &dyn TokenCount,
    metrics: &Metrics,
) -> Result<usize, sqlx::Error> {
    // Scope: as in `rebuild_batch`.
    let mut tx = pool.begin().await?;
    let claimed: Vec<String> = sqlx::query_scalar(include_str!("../../sql/digest/sweep.sql"))
        .bind(MAX_BATCH as i64)
        .fetch_all(&mut *tx)
        .await?;
    Ok(finish(tx, claimed, max_tokens, tok, metrics).await?.len())
}

/// The rest of a rebuild transaction once its markers are claimed: each session's rebuild
/// lock, the facts, the build, the store, the commit. The claims and the locks make it
/// exact under concurrency: a write that commits after the read marks its session again,
/// and a rebuild that read older facts never stores its digest over a newer one.
async fn finish(
    mut tx: sqlx::Transaction<'_, sqlx::Postgres>,
    mut sessions: Vec<String>,
    max_tokens: usize,
    tok: &dyn TokenCount,
    metrics: &Metrics,
) -> Result<Vec<Rebuilt>, sqlx::Error> {
    if sessions.is_empty() {
        return Ok(Vec::new());
    }
    sessions.sort();
    sqlx::query(include_str!("../../sql/digest/lock.sql"))
        .bind(&sessions)
        .execute(&mut *tx)
        .await?;
    let rows = sqlx::query(include_str!("../../sql/digest/active_facts_of.sql"))
        .bind(&sessions)
        .fetch_all(&mut *tx)
        .await?;
    let mut facts: HashMap<String, Vec<Fact>> = HashMap::new();
    for row in &rows {
        let sid: String = row.try_get("session_id")?;
        facts.entry(sid).or_default().push(fact_of(row)?);
    }
    let now = Utc::now();
    let mut out: Vec<Rebuilt> = sessions
        .into_iter()
        .map(|sid| {
            let own = facts.get(&sid).map_or(&[][..], Vec::as_slice);
            Rebuilt {
                built: build(own, now, max_tokens, tok),
                session_id: sid,
                changed: false,
            }
        })
        .collect();
    let changed = store(&mut tx, &out).await?;
    tx.commit().await?;
    for r in &mut out {
        r.changed = changed.contains(&r.session_id);
        if r.changed {
            metrics.digest_rebuilt();
        }
    }
    Ok(out)
}

/// Upserts the digests and records an event for each row written; returns their sessions.
async fn store(
    tx: &mut sqlx::PgConnection,
    rebuilt: &[Rebuilt],
) -> Result<HashSet<String>, sqlx::Error> {
    let text =
        |f: fn(&Rebuilt) -> &str| rebuilt.iter().map(|r| f(r).to_string()).collect::<Vec<_>>();
    let count = |f: fn(&Built) -> usize| {
        rebuilt
            .iter()
            .map(|r| f(&r.built) as i32)
            .collect::<Vec<_>>()
    };
    let expiry: Vec<Option<DateTime<Utc>>> =
        rebuilt.iter().map(|r| r.built.next_expiry_at).collect();
    let changed: Vec<String> = sqlx::query_scalar(include_str!("../../sql/digest/store.sql"))
        .bind(text(|r| &r.session_id))
        .bind(text(|r| &r.built.version))
        .bind(text(|r| &r.built.content))
        .bind(count(|b| b.tokens))
        .bind(count(|b| b.fact_count))
        .bind(expiry)
        .fetch_all(tx)
        .await?;
    Ok(changed.into_iter().collect())
}

/// Rebuilds and stores a session's digest; returns it and whether its version changed.
pub async fn rebuild(
    pool: &PgPool,
    session_id: &str,
    max_tokens: usize,
    tok: &dyn TokenCount,
    metrics: &Metrics,
) -> Result<(Built, bool), sqlx::Error> {
    let sessions = [session_id.to_string()];
    let mut done = rebuild_batch(pool, &sessions, Pick::All, max_tokens, tok, metrics).await?;
    let r = done.pop().expect("Pick::All rebuilds every session");
    Ok((r.built, r.changed))
}

/// Rebuilds the notified sessions whose markers are still there, in batches; returns how
/// many stored digests changed. Repeated names cost nothing: many writes to one session
/// before its rebuild ran are one rebuild.
pub async fn rebuild_notified(
    pool: &PgPool,
    sessions: &[String],
    max_tokens: usize,
    tok: &dyn TokenCount,
    metrics: &Metrics,
) -> Result<usize, sqlx::Error> {
    let mut sessions = sessions.to_vec();
    sessions.sort();
    sessions.dedup();
    let mut changed = 0;
    for chunk in sessions.chunks(MAX_BATCH) {
        let done = rebuild_batch(pool, chunk, Pick::Dirty, max_tokens, tok, metrics).await?;
        changed += done.iter().filter(|r| r.changed).count();
    }
    Ok(changed)
}

/// The digest a turn should use: the stored row, or a fresh build when there is none yet.
pub async fn current(
    pool: &PgPool,
    session_id: &str,
    max_tokens: usize,
    tok: &dyn TokenCount,
    metrics: &Metrics,
) -> Result<Stored, sqlx::Error> {
    let row = sqlx::query(include_str!("../../sql/digest/current.sql"))
        .bind(session_id)
        .fetch_optional(pool)
        .await?;
    if let Some(row) = row {
        return Ok(Stored {
            version: row.try_get("digest_version")?,
            content: row.try_get("digest_content")?,
        });
    }
    let (built, _) = rebuild(pool, session_id, max_tokens, tok, metrics).await?;
    Ok(Stored {
        version: built.version,
        content: built.content,
    })
}

/// Notifications within [`HOT_SPAN`] that switch a rebuilder to polling: about 160 fact
/// writes/s. The doorbell's commit lock lets notifying writes through at about 300/s on a
/// disk that syncs in 4 ms (see `migrations/20261125000070_digest_pollers.sql`), so the
/// switch must come well below that rate, or a queue of writers would never reach it.
const HOT_BELLS: usize = 8;
const HOT_SPAN: Duration = Duration::from_millis(50);
/// How often a polling rebuilder looks for dirty markers: most of a write's rebuild lag.
const HOT_POLL: Duration = Duration::from_millis(2);
/// How long a polling rebuilder's row silences the doorbell. It polls until it has found
/// nothing for this long, refreshing the row four times as often.
const HOT_WINDOW: Duration = Duration::from_secs(1);
/// After it stops polling, a rebuilder looks once more this much later, for writes that
/// saw its row but committed after the row was gone.
const HOT_GRACE: Duration = Duration::from_millis(100);

/// Keeps digests fresh while the worker runs: LISTEN for fact changes, rescan dirty
/// markers on every poll and after every reconnect, and wake at the next expiry. When
/// notifications come fast it polls the markers instead and silences the doorbell.
pub async fn run_rebuilder(
    pool: PgPool,
    tok: Arc<dyn TokenCount>,
    max_tokens: usize,
    poll: Duration,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let me = Rebuilder {
        pool: &pool,
        tok: tok.as_ref(),
        max_tokens,
        metrics: &metrics,
        id: format!("{:016x}", rand::random::<u64>()),
    };
    let mut failures = 0u32;
    while !shutdown.is_cancelled() {
        let ended = me.listen_and_rebuild(poll, &shutdown).await;
        // A row left behind (the database is gone) silences nothing once `until` passes.
        if let Err(e) = me.stop_polling().await {
            debug!(error = %e, "digest poller row not cleared");
        }
        match ended {
            Ok(()) => return,
            Err(e) => {
                failures = (failures + 1).min(8);
                warn!(error = %e, "digest listener lost; reconnecting");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(50 << failures)) => {}
                }
            }
        }
    }
}

/// What the listener passes on: a session whose facts changed, or a reconnect after
/// which notifications may have been missed.
enum Bell {
    Session(String),
    Reconnected,
}

/// One rebuilder's fixed parts.
struct Rebuilder<'a> {
    pool: &'a PgPool,
    tok: &'a dyn TokenCount,
    max_tokens: usize,
    metrics: &'a Metrics,
    /// Its row in `digest_pollers`.
    id: String,
}

/// A polling rebuilder's clock.
struct Polling {
    /// Sessions its last sweep rebuilt: while there is work, it skips the look first.
    found: usize,
    last_work: Instant,
    refreshed: Instant,
    next_expiry: Instant,
}

impl Polling {
    fn new() -> Polling {
        let now = Instant::now();
        Polling {
            found: 0,
            last_work: now,
            refreshed: now,
            next_expiry: now,
        }
    }
}

impl Rebuilder<'_> {
    async fn listen_and_rebuild(
        &self,
        poll: Duration,
        shutdown: &CancellationToken,
    ) -> Result<(), sqlx::Error> {
        let mut listener = PgListener::connect_with(self.pool).await?;
        listener.listen(FACTS_CHANNEL).await?;
        info!("digest rebuilder listening");
        // The listener reads on while a batch is rebuilt, so the next batch takes every
        // session notified meanwhile; dropping the set stops it.
        let (bells, mut rung) = tokio::sync::mpsc::unbounded_channel();
        let mut ringer = tokio::task::JoinSet::new();
        ringer.spawn(ring(listener, bells));
        // Anything marked while we were not listening is found here.
        self.rebuild_due().await?;
        let mut recent: VecDeque<Instant> = VecDeque::new();
        let mut polling: Option<Polling> = None;
        loop {
            if let Some(p) = &mut polling {
                if !self.poll_step(p, &mut rung, &mut ringer, shutdown).await? {
                    return Ok(());
                }
                if p.last_work.elapsed() < HOT_WINDOW {
                    continue;
                }
                polling = None;
                self.stop_polling().await?;
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(HOT_GRACE) => {}
                }
                self.sweep_all().await?;
                info!("digest rebuilder back on notifications");
                continue;
            }
            let wait = next_wait(self.pool, poll).await?;
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                bell = rung.recv() => {
                    let Some(bell) = bell else { return Err(ringer_error(&mut ringer).await) };
                    let (sessions, rang) = self.take_bells(bell, &mut rung).await?;
                    let changed = self.rebuild_notified(&sessions).await?;
                    debug!(notified = rang, changed, "digests rebuilt on notify");
                    if fast(&mut recent, rang) {
                        self.start_polling().await?;
                        polling = Some(Polling::new());
                        info!("digest rebuilder polling: fact writes come fast");
                    }
                },
                _ = tokio::time::sleep(wait) => {
                    self.rebuild_due().await?;
                }
            }
        }
    }

    /// One polling step: sweep, keep the row and the expiries current, then wait for the
    /// next poll (draining the bells that still come). False on shutdown.
    async fn poll_step(
        &self,
        p: &mut Polling,
        rung: &mut UnboundedReceiver<Bell>,
        ringer: &mut JoinSet<Result<(), sqlx::Error>>,
        shutdown: &CancellationToken,
    ) -> Result<bool, sqlx::Error> {
        let found = if p.found > 0 {
            sweep_now(self.pool, self.max_tokens, self.tok, self.metrics).await?
        } else {
            sweep(self.pool, self.max_tokens, self.tok, self.metrics).await?
        };
        p.found = found;
        let now = Instant::now();
        if found > 0 {
            p.last_work = now;
        }
        if now.duration_since(p.refreshed) >= HOT_WINDOW / 4 {
            self.start_polling().await?;
            p.refreshed = now;
        }
        if now >= p.next_expiry {
            self.rebuild_due().await?;
            p.next_expiry = now + next_wait(self.pool, HOT_WINDOW / 4).await?;
        }
        if found == MAX_BATCH {
            return Ok(true);
        }
        tokio::select! {
            _ = shutdown.cancelled() => Ok(false),
            bell = rung.recv() => {
                let Some(bell) = bell else { return Err(ringer_error(ringer).await) };
                // The sweeps take these sessions; a reconnect is rescanned in take_bells.
                self.take_bells(bell, rung).await?;
                Ok(true)
            },
            _ = tokio::time::sleep(HOT_POLL) => Ok(true),
        }
    }

    /// Takes `first` and every bell already queued; returns the sessions named and how
    /// many bells rang. A reconnect rescans the dirty markers at once.
    async fn take_bells(
        &self,
        first: Bell,
        rung: &mut UnboundedReceiver<Bell>,
    ) -> Result<(Vec<String>, usize), sqlx::Error> {
        let mut sessions = Vec::new();
        let mut rescan = false;
        for bell in std::iter::once(first).chain(std::iter::from_fn(|| rung.try_recv().ok())) {
            match bell {
                Bell::Session(sid) => sessions.push(sid),
                Bell::Reconnected => rescan = true,
            }
        }
        let rang = sessions.len();
        if rescan {
            warn!("digest listener reconnected; rescanning dirty markers");
            self.rebuild_due().await?;
        }
        Ok((sessions, rang))
    }

    async fn sweep_all(&self) -> Result<(), sqlx::Error> {
        while sweep(self.pool, self.max_tokens, self.tok, self.metrics).await? == MAX_BATCH {}
        Ok(())
    }

    async fn rebuild_notified(&self, sessions: &[String]) -> Result<usize, sqlx::Error> {
        rebuild_notified(self.pool, sessions, self.max_tokens, self.tok, self.metrics).await
    }

    async fn rebuild_due(&self) -> Result<usize, sqlx::Error> {
        rebuild_due(self.pool, self.tok, self.max_tokens, self.metrics).await
    }

    async fn start_polling(&self) -> Result<(), sqlx::Error> {
        sqlx::query(include_str!("../../sql/digest/poller_set.sql"))
            .bind(&self.id)
            .bind(HOT_WINDOW.as_millis() as f64)
            .execute(self.pool)
            .await?;
        Ok(())
    }

    async fn stop_polling(&self) -> Result<(), sqlx::Error> {
        sqlx::query(include_str!("../../sql/digest/poller_clear.sql"))
            .bind(&self.id)
            .execute(self.pool)
            .await?;
        Ok(())
    }
}

/// Notes `rang` notifications; true once [`HOT_BELLS`] came within [`HOT_SPAN`].
fn fast(recent: &mut VecDeque<Instant>, rang: usize) -> bool {
    let now = Instant::now();
    recent.extend(std::iter::repeat_n(now, rang.min(HOT_BELLS)));
    while recent.len() > HOT_BELLS
        || recent
            .front()
            .is_some_and(|t| now.duration_since(*t) > HOT_SPAN)
    {
        recent.pop_front();
    }
    recent.len() >= HOT_BELLS
}

/// Why the listener task ended: its error, or the pool closing under it.
async fn ringer_error(ringer: &mut JoinSet<Result<(), sqlx::Error>>) -> sqlx::Error {
    match ringer.join_next().await {
        Some(Ok(Err(e))) => e,
        _ => sqlx::Error::PoolClosed,
    }
}

/// Forwards notifications until the connection fails or the rebuilder stops listening.
async fn ring(mut listener: PgListener, bells: UnboundedSender<Bell>) -> Result<(), sqlx::Error> {
    loop {
        let bell = match listener.try_recv().await? {
            Some(n) => Bell::Session(n.payload().to_string()),
            None => Bell::Reconnected,
        };
        if bells.send(bell).is_err() {
            return Ok(());
        }
    }
}

/// How long to sleep: until the next fact expiry, at most one poll interval.
async fn next_wait(pool: &PgPool, poll: Duration) -> Result<Duration, sqlx::Error> {
    let next: Option<DateTime<Utc>> =
        sqlx::query_scalar(include_str!("../../sql/digest/next_expiry.sql"))
            .fetch_one(pool)
            .await?;
    let Some(next) = next else { return Ok(poll) };
    let until = (next - Utc::now()).to_std().unwrap_or(Duration::ZERO);
    Ok(until.min(poll) + Duration::from_millis(5))
}

/// Rebuilds every session that is dirty or has an expired fact in its digest.
pub async fn rebuild_due(
    pool: &PgPool,
    tok: &dyn TokenCount,
    max_tokens: usize,
    metrics: &Metrics,
) -> Result<usize, sqlx::Error> {
    let due: Vec<String> = sqlx::query_scalar(include_str!("../../sql/digest/due.sql"))
        .fetch_all(pool)
        .await?;
    for chunk in due.chunks(MAX_BATCH) {
        rebuild_batch(pool, chunk, Pick::All, max_tokens, tok, metrics).await?;
    }
    Ok(due.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::tokens::WordCount;

    fn fact(t: &str, v: &str) -> Fact {
        Fact {
            fact_type: t.into(),
            value: v.into(),
            expires_at: None,
        }
    }

    #[test]
    fn seed_example_renders_sorted() {
        let facts = vec![
            fact("debt", "Owes 500 credits to First Bank"),
            fact("conflict", "War with Merchant Guild  over trade routes  "),
            fact("alliance", "Tech Syndicate partnership"),
        ];
        let b = build(&facts, Utc::now(), 180, &WordCount);
        assert_eq!(
            b.content,
            "Alliance: Tech Syndicate partnership\nConflict: War with Merchant Guild over trade routes\nDebt: Owes 500 credits to First Bank"
        );
        assert_eq!(b.version, version_of(&b.content));
        assert_eq!(b.version.len(), 64);
    }

    #[test]
    fn order_does_not_matter() {
        let mut facts = vec![
            fact("quest", "Find the relic"),
            fact("rumor", "Gate closes"),
            fact("debt", "Owes 5"),
        ];
        let a = build(&facts, Utc::now(), 180, &WordCount);
        facts.reverse();
        assert_eq!(a, build(&facts, Utc::now(), 180, &WordCount));
    }

    #[test]
    fn trimming_drops_unknown_then_ephemeral() {
        let facts = vec![
            fact("conflict", "a b c"),
            fact("buff", "d e f"),
            fact("gossip", "g h i"),
        ];
        // Each line is 4 words; 8 fits two lines.
        let b = build(&facts, Utc::now(), 8, &WordCount);
        assert_eq!(b.content, "Buff: d e f\nConflict: a b c");
        let b = build(&facts, Utc::now(), 4, &WordCount);
        assert_eq!(b.content, "Conflict: a b c");
    }

    #[test]
    fn expired_facts_are_out() {
        let now = Utc::now();
        let mut buff = fact("buff", "Shielded");
        buff.expires_at = Some(now - chrono::Duration::seconds(1));
        let b = build(&[buff.clone(), fact("debt", "x")], now, 180, &WordCount);
        assert_eq!(b.content, "Debt: x");
        buff.expires_at = Some(now + chrono::Duration::seconds(5));
        let b = build(&[buff.clone(), fact("debt", "x")], now, 180, &WordCount);
        assert_eq!(b.content, "Buff: Shielded\nDebt: x");
        assert_eq!(b.next_expiry_at, buff.expires_at);
    }
}
