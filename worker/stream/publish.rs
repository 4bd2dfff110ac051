//! The worker's side of a streamed reply. The engine thread hands text to a [`TurnStream`]
//! (a channel send, which never blocks the token loop); one task per worker publishes
//! whatever has accumulated in one statement, so when Postgres is slower than the model
//! the tokens of that wait travel together as one delta instead of queueing up.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use sqlx::PgPool;
use tokio::sync::{mpsc, Notify};
use tracing::warn;

use super::delta::{pieces, Delta, MAX_DELTA_BYTES};

/// One attempt's stream, as the publisher keys it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    turn_id: i64,
    attempt: i64,
}

enum Msg {
    /// Text to append; `start` opens the attempt (seq 0, a reset, with what the turn knew).
    Text {
        key: Key,
        session_id: Arc<str>,
        text: String,
        start: Option<Value>,
        done: bool,
        /// On the last text: told once it is published (or could not be).
        flushed: Option<Arc<Notify>>,
    },
    /// The attempt ended without its last text (an error or an abort): forget its state.
    Gone(Key),
}

/// Sends deltas for the turns of one worker; cheap to clone. The task behind it ends when
/// the last clone and the last [`TurnStream`] are gone.
#[derive(Clone)]
pub struct Publisher {
    tx: mpsc::UnboundedSender<Msg>,
}

impl Publisher {
    /// Starts the publishing task on the current runtime.
    pub fn spawn(pool: PgPool) -> Publisher {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(pool, rx));
        Publisher { tx }
    }

    /// Where one run of a turn streams to; `attempt` is the run's fencing token.
    pub fn target(&self, turn_id: i64, attempt: i64, session_id: &str) -> Target {
        Target {
            tx: self.tx.clone(),
            key: Key { turn_id, attempt },
            session_id: session_id.into(),
            flushed: Arc::new(Notify::new()),
        }
    }
}

/// One run of a turn, before it streams: cheap to clone, since a run whose snapshot is
/// refused starts over cold and opens its stream only then.
#[derive(Clone)]
pub struct Target {
    tx: mpsc::UnboundedSender<Msg>,
    key: Key,
    session_id: Arc<str>,
    flushed: Arc<Notify>,
}

impl Target {
    pub fn open(&self) -> TurnStream {
        TurnStream {
            tx: self.tx.clone(),
            key: self.key.clone(),
            session_id: self.session_id.clone(),
            state: State::New,
            flushed: self.flushed.clone(),
        }
    }

    /// Waits, at most `max`, until the run's last delta is published, so that the turn's
    /// end message (sent at its commit) follows every delta of the committing attempt.
    /// Call it only for a run whose stream ended.
    pub async fn flushed(&self, max: Duration) {
        let _ = tokio::time::timeout(max, self.flushed.notified()).await;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    New,
    Open,
    Ended,
}

/// One run of a turn, as its engine thread streams it: [`TurnStream::start`], text, then
/// [`TurnStream::end`]. Dropped before its end (a failed or aborted run), it tells the
/// publisher, and the turn's next run starts a new attempt with a reset.
pub struct TurnStream {
    tx: mpsc::UnboundedSender<Msg>,
    key: Key,
    session_id: Arc<str>,
    state: State,
    flushed: Arc<Notify>,
}

impl TurnStream {
    /// Opens the attempt: seq 0, `reset`, carrying `meta` and the text known before the
    /// first token (an in-chat command's answer, which opens the reply).
    pub fn start(&mut self, meta: Value, text: String) {
        if self.state == State::New {
            self.send(text, Some(meta), false);
            self.state = State::Open;
        }
    }

    /// Appends text to the reply.
    pub fn text(&mut self, text: String) {
        if self.state == State::Open && !text.is_empty() {
            self.send(text, None, false);
        }
    }

    /// The reply's last text: the attempt's text is whole.
    pub fn end(&mut self, text: String) {
        if self.state == State::Open {
            self.send(text, None, true);
            self.state = State::Ended;
        } else {
            self.flushed.notify_one();
        }
    }

    fn send(&self, text: String, start: Option<Value>, done: bool) {
        let sent = self.tx.send(Msg::Text {
            key: self.key.clone(),
            session_id: self.session_id.clone(),
            text,
            start,
            done,
            flushed: done.then(|| self.flushed.clone()),
        });
        // A send fails only once the publisher is gone (the worker is stopping): the reply
        // is still stored, and readers still get the turn's end.
        if sent.is_err() && done {
            self.flushed.notify_one();
        }
    }
}

impl Drop for TurnStream {
    fn drop(&mut self) {
        if self.state == State::Open {
            let _ = self.tx.send(Msg::Gone(self.key.clone()));
        }
    }
}

/// A delta ready to go, with the session whose channel also gets it.
struct Out {
    delta: Delta,
    session_id: Arc<str>,
}

/// The publishing task: takes everything queued, joins consecutive text of one attempt,
/// and publishes the batch in one statement.
async fn run(pool: PgPool, mut rx: mpsc::UnboundedReceiver<Msg>) {
    let mut next_seq: HashMap<Key, i32> = HashMap::new();
    // Attempts whose deltas could not be stored: later ones would leave a gap, so they are
    // dropped, and readers take the stored reply at the turn's end.
    let mut broken: HashSet<Key> = HashSet::new();
    let mut batch = Vec::new();
    while rx.recv_many(&mut batch, 1024).await > 0 {
        let flushed: Vec<Arc<Notify>> = batch
            .iter()
            .filter_map(|m| match m {
                Msg::Text { flushed, .. } => flushed.clone(),
                Msg::Gone(_) => None,
            })
            .collect();
        let out = deltas(std::mem::take(&mut batch), &mut next_seq, &broken);
        if out.is_empty() {
            flushed.iter().for_each(|f| f.notify_one());
            continue;
        }
        let published = publish(&pool, &out).await;
        flushed.iter().for_each(|f| f.notify_one());
        if let Err(e) = published {
            warn!(error = %e, deltas = out.len(), "reply deltas not published; their readers fall back to the stored reply");
            // Only attempts still open: an ended one has nothing more to drop.
            broken.extend(
                out.iter()
                    .map(|o| Key {
                        turn_id: o.delta.turn_id,
                        attempt: o.delta.attempt,
                    })
                    .filter(|k| next_seq.contains_key(k)),
            );
        } else {
            stop_mid_stream(&out);
        }
        broken.retain(|k| next_seq.contains_key(k));
    }
}

/// Queued text of one attempt, joined.
struct Run {
    key: Key,
    session_id: Arc<str>,
    text: String,
    start: Option<Value>,
    done: bool,
}

/// Turns queued messages into numbered deltas: consecutive text of one attempt becomes one
/// delta (cut into pieces of at most [`MAX_DELTA_BYTES`]), seq counts per attempt.
fn deltas(msgs: Vec<Msg>, next_seq: &mut HashMap<Key, i32>, broken: &HashSet<Key>) -> Vec<Out> {
    let mut runs: Vec<Run> = Vec::new();
    let mut gone = Vec::new();
    for msg in msgs {
        match msg {
            Msg::Gone(key) => gone.push(key),
            Msg::Text {
                key,
                session_id,
                text,
                start,
                done,
                ..
            } => match runs.last_mut() {
                Some(last) if last.key == key && !last.done && start.is_none() => {
                    last.text.push_str(&text);
                    last.done = done;
                }
                _ => runs.push(Run {
                    key,
                    session_id,
                    text,
                    start,
                    done,
                }),
            },
        }
    }
    let mut out = Vec::new();
    for run in runs {
        if run.start.is_some() {
            next_seq.insert(run.key.clone(), 0);
        }
        let Some(seq) = next_seq.get_mut(&run.key) else {
            continue;
        };
        let parts = pieces(&run.text, MAX_DELTA_BYTES);
        let last = parts.len() - 1;
        for (i, part) in parts.into_iter().enumerate() {
            let delta = Delta {
                turn_id: run.key.turn_id,
                attempt: run.key.attempt,
                seq: *seq,
                reset: *seq == 0,
                text: part.to_string(),
                done: run.done && i == last,
                meta: if i == 0 { run.start.clone() } else { None },
            };
            *seq += 1;
            if !broken.contains(&run.key) {
                out.push(Out {
                    delta,
                    session_id: run.session_id.clone(),
                });
            }
        }
        if run.done {
            next_seq.remove(&run.key);
        }
    }
    // After the runs: what an ended attempt had queued still goes out, in order.
    for key in gone {
        next_seq.remove(&key);
    }
    out
}

/// One statement for the batch; a failure is retried twice, briefly.
async fn publish(pool: &PgPool, out: &[Out]) -> Result<(), sqlx::Error> {
    let rows: Vec<Value> = out
        .iter()
        .map(|o| {
            let d = &o.delta;
            json!({
                "turn_id": d.turn_id,
                "session_id": &*o.session_id,
                "attempt": d.attempt,
                "seq": d.seq,
                "text": d.text,
                "done": d.done,
                "meta": d.meta,
                "payload": serde_json::to_string(d).unwrap_or_default(),
            })
        })
        .collect();
    let rows = Value::Array(rows);
    let mut wait = Duration::from_millis(20);
    for tries_left in (0..3).rev() {
        let sent = sqlx::query(include_str!("../../sql/stream/publish.sql"))
            .bind(&rows)
            .execute(pool)
            .await;
        match sent {
            Ok(_) => return Ok(()),
            Err(e) if tries_left == 0 => return Err(e),
            Err(_) => {
                tokio::time::sleep(wait).await;
                wait *= 4;
            }
        }
    }
    Ok(())
}

/// The test hook `KVMEM_TEST_STOP_AT=mid_stream`: the process stops itself once, right
/// after the first delta with reply text is published, so a test can kill a worker while
/// its reply is half streamed.
fn stop_mid_stream(out: &[Out]) {
    static STOPPED: AtomicBool = AtomicBool::new(false);
    let mid = out
        .iter()
        .any(|o| !o.delta.text.is_empty() && !o.delta.done);
    if mid && !STOPPED.load(Ordering::Relaxed) && crate::faults::stops_at("mid_stream") {
        STOPPED.store(true, Ordering::Relaxed);
        crate::faults::stop_point("mid_stream");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(turn_id: i64, text: &str, start: bool, done: bool) -> Msg {
        Msg::Text {
            key: Key {
                turn_id,
                attempt: 5,
            },
            session_id: "s".into(),
            text: text.into(),
            start: start.then(|| json!({"cold": false})),
            done,
            flushed: None,
        }
    }

    #[test]
    fn queued_text_of_one_attempt_travels_as_one_delta() {
        let mut seqs = HashMap::new();
        let none = HashSet::new();
        let out = deltas(
            vec![
                text(1, "", true, false),
                text(1, "Hel", false, false),
                text(2, "", true, false),
                text(1, "lo", false, false),
                text(1, "!", false, true),
            ],
            &mut seqs,
            &none,
        );
        let got: Vec<(i64, i32, bool, &str, bool)> = out
            .iter()
            .map(|o| {
                let d = &o.delta;
                (d.turn_id, d.seq, d.reset, d.text.as_str(), d.done)
            })
            .collect();
        // The start keeps seq 0 to itself and joins the text after it; turn 2's start
        // splits turn 1's run in two.
        assert_eq!(
            got,
            vec![
                (1, 0, true, "Hel", false),
                (2, 0, true, "", false),
                (1, 1, false, "lo!", true),
            ]
        );
        assert_eq!(out[0].delta.meta, Some(json!({"cold": false})));
        assert_eq!(out[2].delta.meta, None);
        // Turn 1 is finished and forgotten; turn 2 goes on at seq 1.
        let out = deltas(vec![text(2, "x", false, false)], &mut seqs, &none);
        assert_eq!((out[0].delta.seq, out[0].delta.reset), (1, false));
        assert!(!seqs.contains_key(&Key {
            turn_id: 1,
            attempt: 5
        }));
    }

    #[test]
    fn long_text_is_cut_into_numbered_pieces() {
        let mut seqs = HashMap::new();
        // Two bytes a character: a little over two pieces' worth.
        let long = "é".repeat(MAX_DELTA_BYTES + 1);
        let out = deltas(
            vec![text(1, "", true, false), text(1, &long, false, true)],
            &mut seqs,
            &HashSet::new(),
        );
        assert_eq!(out.len(), 3);
        assert_eq!(
            out.iter().map(|o| o.delta.seq).collect::<Vec<_>>(),
            [0, 1, 2]
        );
        assert!(out.iter().all(|o| o.delta.text.len() <= MAX_DELTA_BYTES));
        assert_eq!(
            out.iter()
                .map(|o| o.delta.text.as_str())
                .collect::<String>(),
            long
        );
        assert_eq!(
            out.iter().map(|o| o.delta.done).collect::<Vec<_>>(),
            [false, false, true]
        );
    }
}
