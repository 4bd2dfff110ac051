//! Group commit: finished turns queue here and are committed together, as many as are
//! waiting (up to `complete_batch`) per transaction, with no added delay.

use std::sync::Arc;

use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot, Notify};
use tracing::warn;

use crate::queue::{self, Completion, QueueError};

type Pending = (Completion, oneshot::Sender<queue::Result<()>>);

/// Group commit: finished turns queue here and are committed together, as many as are
/// waiting (up to `complete_batch`) per transaction, with no added delay.
#[derive(Clone)]
pub(super) struct Completer {
    tx: mpsc::Sender<Pending>,
}

impl Completer {
    pub(super) fn spawn(
        pool: PgPool,
        max: usize,
        wake: Arc<Notify>,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> (Completer, tokio::task::JoinHandle<()>) {
        let max = max.max(1);
        let (tx, rx) = mpsc::channel(max * 2);
        let task = tokio::spawn(commit_loop(pool, max, rx, wake, metrics));
        (Completer { tx }, task)
    }

    pub(super) async fn complete(&self, completion: Completion) -> queue::Result<()> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send((completion, tx))
            .await
            .map_err(|_| QueueError::Stopped)?;
        rx.await.map_err(|_| QueueError::Stopped)?
    }
}

async fn commit_loop(
    pool: PgPool,
    max: usize,
    mut rx: mpsc::Receiver<Pending>,
    wake: Arc<Notify>,
    metrics: Arc<crate::metrics::Metrics>,
) {
    while let Some(first) = rx.recv().await {
        let mut pending = vec![first];
        while pending.len() < max {
            match rx.try_recv() {
                Ok(next) => pending.push(next),
                Err(_) => break,
            }
        }
        let (batch, replies): (Vec<Completion>, Vec<_>) = pending.into_iter().unzip();
        let size = batch.len();
        let results = match queue::complete_many(&pool, &batch).await {
            Ok(results) => results,
            Err(e) => {
                // Nothing of the batch was written. One at a time, a single bad completion
                // (or a lock conflict) cannot hold back the others.
                warn!(error = %e, turns = batch.len(), "group commit failed; committing one by one");
                let mut results = Vec::with_capacity(size);
                for c in batch {
                    results.push(queue::complete(&pool, &c.turn, c.output).await);
                }
                results
            }
        };
        metrics.commit_batch(size);
        for (reply, result) in replies.into_iter().zip(results) {
            let _ = reply.send(result);
        }
        // Those sessions' next turns are claimable now.
        wake.notify_one();
    }
}
