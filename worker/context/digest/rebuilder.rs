//! The rebuilder task: wakes on fact notifications, dirty markers and expiries, and
//! switches to polling (silencing the doorbell) when notifications come fast.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::context::tokens::TokenCount;
use crate::metrics::Metrics;

use super::rebuild::{rebuild_due, rebuild_notified, sweep, sweep_now, MAX_BATCH};

/// Channel the `facts` trigger notifies, payload = session id.
pub const FACTS_CHANNEL: &str = "kvmem_facts";

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
        sqlx::query(include_str!("../../../sql/digest/poller_set.sql"))
            .bind(&self.id)
            .bind(HOT_WINDOW.as_millis() as f64)
            .execute(self.pool)
            .await?;
        Ok(())
    }

    async fn stop_polling(&self) -> Result<(), sqlx::Error> {
        sqlx::query(include_str!("../../../sql/digest/poller_clear.sql"))
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
        sqlx::query_scalar(include_str!("../../../sql/digest/next_expiry.sql"))
            .fetch_one(pool)
            .await?;
    let Some(next) = next else { return Ok(poll) };
    let until = (next - Utc::now()).to_std().unwrap_or(Duration::ZERO);
    Ok(until.min(poll) + Duration::from_millis(5))
}
