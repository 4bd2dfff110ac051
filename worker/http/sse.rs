//! `"stream": true`: the reply relayed as OpenAI `chat.completion.chunk` server-sent events
//! while the worker generates it. The relay follows the turn's stream channel through the
//! server's one LISTEN connection ([`crate::stream::Hub`]), so it works wherever the worker
//! runs and whichever worker re-runs the turn.
//!
//! Until the first chunk, every failure is an HTTP error with a JSON body. After it, a
//! failure is an SSE `error` event and the stream closes. The finish chunk and `[DONE]`
//! come only once the reply is stored and equals what was sent; a re-run after text went
//! out (its worker died) cannot be stitched onto it, so that is an error too. A client that
//! goes away changes nothing for the turn: it completes and is stored.

use std::convert::Infallible;
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::answer::{delivered, fingerprint};
use super::error::ApiError;
use super::state::AppState;
use crate::queue::{self, OwnedTurn, TurnId};
use crate::stream::{self, Delta, Follow, Heard, Note, SoFar};

/// What the request asked for.
pub(super) struct Reply {
    pub(super) id: TurnId,
    pub(super) user: String,
    pub(super) model: Option<String>,
    pub(super) include_usage: bool,
}

/// What the relay sends, in order.
enum Out {
    /// The role and the `kvmem` block: the first chunk.
    Start(Value),
    Content(String),
    /// The reply is stored and equals what was sent.
    Finish(Box<OwnedTurn>),
    /// After the first chunk: the stream ends with this error.
    Error(ApiError),
}

/// How often the relay reads the turn when its channel is quiet: a reaped turn that died
/// sends no notification.
const QUIET: Duration = Duration::from_millis(500);

/// Answers a streamed request for turn `reply.id`, already enqueued for `reply.user`.
pub(super) async fn stream(
    state: AppState,
    reply: Reply,
    timeout: Duration,
) -> Result<Response, ApiError> {
    let follow = state.hub.follow(reply.id.0).await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            e.to_string(),
        )
    })?;
    let mut relay = Relay {
        state,
        reply,
        follow,
        deadline: Instant::now() + timeout,
        created: chrono::Utc::now().timestamp(),
        attempt: None,
        seq: -1,
        sent: String::new(),
        started: false,
    };
    let mut first = Vec::new();
    relay.sync(&mut first).await?;
    while !relay.started {
        match relay.next(&mut first).await {
            Ok(()) => {}
            // An error before the first chunk stays an HTTP error.
            Err(Out::Error(e)) => return Err(e),
            Err(other) => first.push(other),
        }
    }
    relay.state.fault("started")?;
    let (tx, rx) = mpsc::channel::<Event>(64);
    tokio::spawn(relay.run(first, tx));
    let events = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|e| (Ok::<_, Infallible>(e), rx))
    });
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}

struct Relay {
    state: AppState,
    reply: Reply,
    follow: Follow,
    deadline: Instant,
    /// Every chunk's `created`.
    created: i64,
    /// The attempt whose text is being relayed, and its last delta.
    attempt: Option<i64>,
    seq: i32,
    /// The content sent so far.
    sent: String,
    /// The first chunk is out.
    started: bool,
}

impl Relay {
    /// Sends `first`, then relays until the turn ends or the client goes away.
    async fn run(mut self, first: Vec<Out>, tx: mpsc::Sender<Event>) {
        let mut outs = first;
        loop {
            for out in outs.drain(..) {
                let out = match out {
                    Out::Finish(row) => self.deliver(self.reply.id, Out::Finish(row)).await,
                    other => other,
                };
                let end = matches!(out, Out::Finish(_) | Out::Error(_));
                for event in self.render(out) {
                    if tx.send(event).await.is_err() {
                        // The client went away; the turn goes on without it.
                        return;
                    }
                }
                if end {
                    return;
                }
            }
            if let Err(out) = self.next(&mut outs).await {
                outs.push(out);
            }
        }
    }

    /// Waits for the next news of the turn and adds what it means to `outs`; `Err` ends
    /// the relay with that last output.
    async fn next(&mut self, outs: &mut Vec<Out>) -> Result<(), Out> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(self.timed_out());
        }
        let heard = tokio::time::timeout(left.min(QUIET), self.follow.rx.recv()).await;
        match heard {
            Ok(Some(Heard::Note(Note::Delta(d)))) => self.delta(d, outs).await,
            Ok(Some(Heard::Note(Note::End { state, .. }))) => self.end(&state, outs).await,
            // Lost notifications, a quiet channel, or a listener that stopped: read the turn.
            Ok(Some(Heard::Lost)) | Err(_) => self.sync(outs).await.map_err(Out::Error),
            Ok(None) => {
                tokio::time::sleep(left.min(QUIET)).await;
                self.sync(outs).await.map_err(Out::Error)
            }
        }
    }

    async fn delta(&mut self, d: Delta, outs: &mut Vec<Out>) -> Result<(), Out> {
        match self.attempt {
            Some(a) if d.attempt < a => Ok(()),
            Some(a) if d.attempt == a => {
                if d.seq <= self.seq {
                    Ok(())
                } else if d.seq == self.seq + 1 {
                    self.seq = d.seq;
                    self.content(d.text, outs);
                    Ok(())
                } else {
                    self.sync(outs).await.map_err(Out::Error)
                }
            }
            _ if d.seq == 0 => {
                self.new_attempt(d.attempt, d.meta.unwrap_or(Value::Null), outs)?;
                self.seq = 0;
                self.content(d.text, outs);
                Ok(())
            }
            // A later attempt's delta without its start: read what it sent so far.
            _ => self.sync(outs).await.map_err(Out::Error),
        }
    }

    /// Follows a new attempt of the turn. Text of an earlier one that already went out
    /// cannot be taken back: that ends the stream with an error.
    fn new_attempt(&mut self, attempt: i64, meta: Value, outs: &mut Vec<Out>) -> Result<(), Out> {
        if !self.sent.is_empty() {
            return Err(Out::Error(stream_error(
                "turn_restarted",
                format!(
                    "turn {} was restarted (its worker stopped) after part of its reply was sent; \
                     the reply will be the new run's, read it with a request for this turn",
                    self.reply.id
                ),
                self.reply.id,
            )));
        }
        self.attempt = Some(attempt);
        self.seq = -1;
        if !self.started {
            self.started = true;
            outs.push(Out::Start(meta));
        }
        Ok(())
    }

    fn content(&mut self, text: String, outs: &mut Vec<Out>) {
        if !text.is_empty() {
            self.sent.push_str(&text);
            outs.push(Out::Content(text));
        }
    }

    /// Catches up from `kvmem_turn_stream`: after the LISTEN, when a notification was
    /// missed, or when the channel was quiet.
    async fn sync(&mut self, outs: &mut Vec<Out>) -> Result<(), ApiError> {
        let Some(so_far) = stream::so_far(&self.state.pool, self.reply.id.0).await? else {
            return Err(super::answer::erased(self.reply.id));
        };
        if matches!(so_far.state.as_str(), "done" | "failed" | "dead") {
            return match self.end(&so_far.state, outs).await {
                Ok(()) => Ok(()),
                Err(Out::Error(e)) => Err(e),
                Err(other) => {
                    outs.push(other);
                    Ok(())
                }
            };
        }
        self.catch_up(so_far, outs)
    }

    fn catch_up(&mut self, so_far: SoFar, outs: &mut Vec<Out>) -> Result<(), ApiError> {
        let (Some(attempt), Some(seq)) = (so_far.attempt, so_far.seq) else {
            return Ok(());
        };
        match self.attempt {
            Some(a) if attempt < a => return Ok(()),
            Some(a) if attempt == a => {}
            _ => {
                let meta = so_far.meta.clone().unwrap_or(Value::Null);
                if let Err(Out::Error(e)) = self.new_attempt(attempt, meta, outs) {
                    return Err(e);
                }
            }
        }
        if seq > self.seq {
            let Some(rest) = so_far.text.strip_prefix(self.sent.as_str()) else {
                return Err(stream_error(
                    "stream_gap",
                    "the reply's stream lost part of its text; read the stored reply",
                    self.reply.id,
                ));
            };
            self.seq = seq;
            self.content(rest.to_string(), outs);
        }
        Ok(())
    }

    /// The turn ended: finish with what is stored, or fail.
    async fn end(&mut self, state: &str, outs: &mut Vec<Out>) -> Result<(), Out> {
        let id = self.reply.id;
        let row = match queue::owned_turn(&self.state.pool, id, &self.reply.user).await {
            Ok(Some(row)) => row,
            Ok(None) => return Err(Out::Error(super::answer::erased(id))),
            Err(e) => return Err(Out::Error(e.into())),
        };
        if let Some(e) = row.error(id) {
            return Err(self.deliver(id, Out::Error(e)).await);
        }
        if state != "done" || row.state != "done" {
            return Ok(());
        }
        let stored = row.reply.clone().unwrap_or_default();
        let Some(rest) = stored.strip_prefix(self.sent.as_str()) else {
            return Err(Out::Error(stream_error(
                "turn_restarted",
                format!(
                    "turn {id} was re-run after part of its reply was sent, and the stored \
                     reply differs; read it with a request for this turn"
                ),
                id,
            )));
        };
        if !self.started {
            // Stored before any delta was heard (deltas off, or the echo generator).
            self.started = true;
            outs.push(Out::Start(json!({})));
        }
        let rest = rest.to_string();
        self.content(rest, outs);
        Err(Out::Finish(Box::new(row)))
    }

    /// The turn's answer, `last` (its finish, or the error it ended with), goes out next:
    /// recorded as delivered first, so that the client's next request finds it so
    /// ([`delivered`]).
    async fn deliver(&self, id: TurnId, last: Out) -> Out {
        match delivered(&self.state.pool, id).await {
            Ok(()) => last,
            Err(e) => Out::Error(e.into()),
        }
    }

    fn timed_out(&self) -> Out {
        let mut e = ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "timeout",
            format!("turn {} did not finish in time; it goes on", self.reply.id),
        );
        e.extra = json!({ "turn_id": self.reply.id.0 });
        Out::Error(e)
    }

    /// The SSE events for one output.
    fn render(&self, out: Out) -> Vec<Event> {
        let id = self.reply.id;
        match out {
            Out::Start(meta) => {
                let mut kvmem = json!({ "turn_id": id.0, "attempt": self.attempt });
                if let (Value::Object(k), Value::Object(m)) = (&mut kvmem, meta) {
                    k.extend(m);
                }
                let mut c = self.chunk(json!({ "role": "assistant", "content": "" }), None);
                c["kvmem"] = kvmem;
                vec![data(&c)]
            }
            Out::Content(text) => vec![data(&self.chunk(json!({ "content": text }), None))],
            Out::Finish(row) => {
                let mut c = self.chunk(json!({}), Some(row.finish_reason()));
                c["kvmem"] = row.kvmem(id);
                let mut events = vec![data(&c)];
                if self.reply.include_usage {
                    let mut u = self.chunk(Value::Null, None);
                    u["choices"] = json!([]);
                    u["usage"] = row.usage();
                    events.push(data(&u));
                }
                events.push(Event::default().data("[DONE]"));
                events
            }
            Out::Error(e) => vec![Event::default()
                .event("error")
                .data(json!({ "error": e.body() }).to_string())],
        }
    }

    /// A `chat.completion.chunk` with one choice holding `delta`.
    fn chunk(&self, delta: Value, finish: Option<&str>) -> Value {
        let mut c = json!({
            "id": format!("chatcmpl-{}", self.reply.id.0),
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.reply.model.as_deref().unwrap_or("kvmem"),
            "system_fingerprint": fingerprint(&self.state),
            "choices": [{ "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish }],
        });
        if self.reply.include_usage {
            c["usage"] = Value::Null;
        }
        c
    }
}

fn data(chunk: &Value) -> Event {
    Event::default().data(chunk.to_string())
}

fn stream_error(code: &str, message: impl Into<String>, id: TurnId) -> ApiError {
    let mut e = ApiError::new(StatusCode::BAD_GATEWAY, "server_error", message);
    e.extra = json!({ "code": code, "turn_id": id.0 });
    e
}
