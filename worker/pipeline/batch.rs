//! Gathers turns of different sessions into batches for one engine thread
//! (`KVMEM_BATCH_SESSIONS`): a turn waits at most `KVMEM_BATCH_WAIT_MS` for others to join
//! it, and a batch forms only when an engine thread is free to run it, so turns that
//! arrive while every thread is busy join the next batch instead of queueing one by one.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Semaphore};

use super::kv::{self, BatchTurn, KvOutcome, Start, TurnJob};
use crate::engine::EnginePool;
use crate::metrics::Metrics;
use crate::turn::TurnError;

type Reply = oneshot::Sender<Result<KvOutcome, TurnError>>;

/// The door to batched engine work.
pub struct Batcher {
    tx: mpsc::UnboundedSender<(BatchTurn, Reply)>,
}

impl Batcher {
    /// Starts the task that forms batches of at most `engines.batch_sessions()` turns.
    pub fn start(engines: Arc<EnginePool>, wait: Duration, metrics: Arc<Metrics>) -> Batcher {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(form_batches(engines, wait, metrics, rx));
        Batcher { tx }
    }

    /// Runs one turn's engine part in the next batch.
    pub async fn run(
        &self,
        job: TurnJob,
        start: Start,
        abort: Arc<AtomicBool>,
    ) -> Result<KvOutcome, TurnError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send((BatchTurn { job, start, abort }, reply))
            .map_err(|_| TurnError::retryable("the batching task has stopped"))?;
        answer
            .await
            .map_err(|_| TurnError::retryable("the batched decode dropped this turn"))?
    }
}

async fn form_batches(
    engines: Arc<EnginePool>,
    wait: Duration,
    metrics: Arc<Metrics>,
    mut rx: mpsc::UnboundedReceiver<(BatchTurn, Reply)>,
) {
    let size = engines.batch_sessions().max(1) as usize;
    let free = Arc::new(Semaphore::new(engines.slots() as usize));
    loop {
        let Ok(permit) = free.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = rx.recv().await else {
            return;
        };
        let mut turns = vec![first];
        let deadline = tokio::time::Instant::now() + wait;
        while turns.len() < size {
            // Whatever is already queued joins without waiting.
            match rx.try_recv() {
                Ok(turn) => turns.push(turn),
                Err(_) => match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(turn)) => turns.push(turn),
                    _ => break,
                },
            }
        }
        let engines = engines.clone();
        metrics.decode_batch(turns.len());
        tokio::spawn(async move {
            let (batch, replies): (Vec<_>, Vec<_>) = turns.into_iter().unzip();
            let n = batch.len();
            match engines
                .run_with_contexts(move |engine, ctxs| kv::run_batch(engine, ctxs, batch))
                .await
            {
                Ok(results) if results.len() == n => {
                    for (reply, result) in replies.into_iter().zip(results) {
                        let _ = reply.send(result);
                    }
                }
                Ok(_) => {
                    for reply in replies {
                        let _ = reply.send(Err(TurnError::retryable(
                            "the batched decode lost track of its turns",
                        )));
                    }
                }
                Err(e) => {
                    let message = e.to_string();
                    for reply in replies {
                        let _ = reply.send(Err(TurnError::retryable(message.clone())));
                    }
                }
            }
            drop(permit);
        });
    }
}
