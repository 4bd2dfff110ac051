//! Seed 000's turn pipeline: load the snapshot (warm) or rebuild from `messages` (cold),
//! prune, add HUD, digest and user message, generate, drop the ephemeral HUD, prune, save.
//! Database reads and file I/O happen here; llama.cpp work runs on the engine threads.

use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;

use llama_cpp_2::context::LlamaContext;
use sqlx::{PgPool, Row};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::config::Settings;
use crate::digest;
use crate::engine::{Engine, EngineError, GenStats, KvSession, LLAMA_BUILD};
use crate::generator::TurnError;
use crate::hud;
use crate::kvlog::{KvLog, TurnPath};
use crate::queue::ClaimedTurn;
use crate::snapshot::{
    self, Compression, Header, Limits, Loaded, SegKind, Snapshot, SnapshotStore,
};
use crate::tokens::TokenCount;
use crate::worker::Deps;

/// How many recent messages a cold start reads back (bounded again by the tail).
const HISTORY_MESSAGES: i64 = 400;

type Job = Box<dyn FnOnce(&Engine, &mut LlamaContext<'static>) + Send>;

/// Engine threads, each owning one llama.cpp context. Jobs never run on the tokio runtime.
pub struct EnginePool {
    engine: Arc<Engine>,
    jobs: mpsc::Sender<Job>,
}

impl EnginePool {
    /// Starts `slots` threads and creates their contexts; fails if any context cannot be made.
    pub fn start(engine: Arc<Engine>, slots: u32) -> Result<EnginePool, EngineError> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for slot in 0..slots {
            let (engine, rx) = (engine.clone(), rx.clone());
            let (ready_tx, ready_rx) = mpsc::channel();
            std::thread::Builder::new()
                .name(format!("kvmem-engine-{slot}"))
                .spawn(move || {
                    let mut ctx = match engine.new_context() {
                        Ok(ctx) => {
                            let _ = ready_tx.send(Ok(()));
                            ctx
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    loop {
                        let job = match rx.lock() {
                            Ok(rx) => rx.recv(),
                            Err(_) => return,
                        };
                        match job {
                            Ok(job) => job(&engine, &mut ctx),
                            Err(_) => return,
                        }
                    }
                })
                .map_err(|e| EngineError::Context(e.to_string()))?;
            ready_rx
                .recv()
                .map_err(|_| EngineError::Context("engine thread died".into()))??;
        }
        Ok(EnginePool { engine, jobs: tx })
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Runs `f` on an engine thread and awaits its result.
    pub async fn run<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Engine, &mut LlamaContext<'static>) -> R + Send + 'static,
    ) -> Result<R, EngineError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |engine, ctx| {
            let _ = tx.send(f(engine, ctx));
        });
        self.jobs
            .send(job)
            .map_err(|_| EngineError::Context("engine threads are gone".into()))?;
        rx.await
            .map_err(|_| EngineError::Context("engine thread panicked".into()))
    }
}

/// What the engine thread needs for one turn.
pub struct TurnJob {
    pub base_prompt: String,
    pub hud: String,
    pub digest: digest::Stored,
    pub user: String,
    pub snapshot: Option<Box<Snapshot>>,
    /// Recent exchanges, oldest first, for a cold start.
    pub history: Vec<(String, String)>,
    pub tail: u32,
    pub reply_max: u32,
    pub export: bool,
}

/// What the engine thread produced.
#[derive(Debug)]
pub struct TurnRun {
    pub reply: String,
    pub token_ids: Vec<i32>,
    pub segments: Vec<snapshot::Segment>,
    pub state: Option<Vec<u8>>,
    pub warm: bool,
    pub cold_reason: Option<String>,
    pub tokens_loaded: u32,
    pub digest_injected: bool,
    /// The digest version the saved KV has seen ("" if none).
    pub kv_digest_version: String,
    pub s_tokens: u32,
    pub u_tokens: u32,
    pub r_tokens: u32,
    pub load_ms: u64,
    pub stats: GenStats,
}

/// A turn failure inside the engine: `fatal` for input that can never fit.
#[derive(Debug)]
pub struct RunError {
    pub message: String,
    pub fatal: bool,
    pub aborted: bool,
}

impl From<EngineError> for RunError {
    fn from(e: EngineError) -> RunError {
        RunError {
            aborted: matches!(e, EngineError::Aborted),
            message: e.to_string(),
            fatal: false,
        }
    }
}

/// Runs one turn inside a context: steps 1–5 of seed 000 (the save itself is the caller's).
pub fn run_in_context(
    engine: &Engine,
    ctx: &mut LlamaContext<'static>,
    job: TurnJob,
    abort: &AtomicBool,
) -> Result<TurnRun, RunError> {
    let started = Instant::now();
    let base = engine.base_tokens(&job.base_prompt);
    let hud = engine.block(&engine.frame.system, &[&job.hud]);
    let user = engine.block(&engine.frame.user, &[&job.user]);
    let close = engine.tokenize_special(&engine.frame.reply_close, false);
    let n_ctx = engine.params.n_ctx;

    // 1. Load: warm from the snapshot, or cold.
    let mut cold_reason = None;
    let mut seen_digest = String::new();
    let mut session = None;
    if let Some(snap) = &job.snapshot {
        let prefix_ok = snap.token_ids.len() >= base.len()
            && snap.token_ids[..base.len()]
                .iter()
                .zip(&base)
                .all(|(a, b)| *a == b.0);
        if !prefix_ok {
            cold_reason = Some("base prompt changed".to_string());
        } else {
            match KvSession::restore(
                engine,
                &mut *ctx,
                &snap.state,
                &snap.token_ids,
                &snap.header.segments,
            ) {
                Ok(s) => {
                    seen_digest = snap.header.digest_version.clone();
                    session = Some(s);
                }
                Err(e) => cold_reason = Some(e.to_string()),
            }
        }
    }
    let warm = session.is_some();
    let mut session = match session {
        Some(s) => s,
        None => KvSession::empty(engine, ctx),
    };
    let tokens_loaded = session.len();
    let load_ms = started.elapsed().as_millis() as u64;

    let prefill_started = Instant::now();
    if !warm {
        session.append(&base, Some(SegKind::Base))?;
        rebuild_history(
            engine,
            &mut session,
            &job.history,
            job.tail.saturating_sub(close.len() as u32),
        )?;
    }

    // 3. Digest only when the KV has not seen this version, or it was pruned away.
    let has_digest = session.segments().iter().any(|s| s.kind == SegKind::Digest);
    let stale = seen_digest != job.digest.version;
    let inject = if job.digest.content.is_empty() {
        // An emptied digest is injected once, so the KV stops believing the old one.
        warm && stale && !seen_digest.is_empty()
    } else {
        !warm || stale || !has_digest
    };
    let digest_tokens = if inject {
        let content = if job.digest.content.is_empty() {
            "(nothing notable)"
        } else {
            &job.digest.content
        };
        engine.block(&engine.frame.system, &[&format!("World state:\n{content}")])
    } else {
        Vec::new()
    };

    // 2. Budget: HUD + digest + KV + user + reply <= N_CTX; prune harder when needed.
    let need = (hud.len() + digest_tokens.len() + user.len() + close.len()) as u32 + job.reply_max;
    if base.len() as u32 + need > n_ctx {
        return Err(RunError {
            message: format!(
                "message does not fit the context: base {} + HUD {} + digest {} + message {} + reply {} tokens > N_CTX {}",
                base.len(), hud.len(), digest_tokens.len(), user.len(), job.reply_max, n_ctx
            ),
            fatal: true,
            aborted: false,
        });
    }
    session.prune_to(job.tail.min(n_ctx - need))?;

    if inject {
        session.append(&digest_tokens, Some(SegKind::Digest))?;
    }
    let hud_start = session.len();
    session.append(&hud, Some(SegKind::Turn))?;
    session.append(&user, Some(SegKind::Turn))?;
    let mut stats = GenStats {
        prefill_ms: prefill_started.elapsed().as_millis() as u64,
        ..GenStats::default()
    };

    // 4. Generate.
    let reply = session.generate(job.reply_max, abort, &mut stats)?;
    stats.ttft_ms += started.elapsed().as_millis() as u64 - stats.generate_ms;

    // 5. The HUD is ephemeral; prune to the tail; close the reply. Decoding the close
    // applies the position shift, so the exported state is already rotated.
    session.remove(hud_start, hud_start + hud.len() as u32)?;
    session.prune_to(job.tail.saturating_sub(close.len() as u32))?;
    session.append(&close, None)?;

    let state = job.export.then(|| session.export_state());
    Ok(TurnRun {
        reply: engine.detokenize(&reply),
        token_ids: session.token_ids(),
        segments: session.segments().to_vec(),
        state,
        warm,
        cold_reason: if warm {
            None
        } else {
            cold_reason.or(Some("no snapshot".into()))
        },
        tokens_loaded,
        digest_injected: inject,
        kv_digest_version: if inject {
            job.digest.version.clone()
        } else {
            seen_digest
        },
        s_tokens: if inject {
            digest_tokens.len() as u32
        } else {
            0
        },
        u_tokens: engine.count_tokens(&job.user) as u32,
        r_tokens: reply.len() as u32,
        load_ms,
        stats,
    })
}

/// Re-reads the most recent exchanges that fit `budget` tokens in total (base included).
fn rebuild_history(
    engine: &Engine,
    session: &mut KvSession,
    history: &[(String, String)],
    budget: u32,
) -> Result<(), RunError> {
    let mut picked = Vec::new();
    let mut total = session.len();
    for (u, a) in history.iter().rev() {
        let t = engine.block(&engine.frame.exchange, &[u, a]);
        if total + t.len() as u32 > budget {
            break;
        }
        total += t.len() as u32;
        picked.push(t);
    }
    for t in picked.iter().rev() {
        session.append(t, Some(SegKind::Turn))?;
    }
    Ok(())
}

/// The llama.cpp generator: engine threads, snapshot store and settings.
pub struct TurnPipeline {
    pub pool: EnginePool,
    pub store: SnapshotStore,
    pub settings: Arc<Settings>,
}

impl TurnPipeline {
    pub fn new(engine: Arc<Engine>, settings: Arc<Settings>) -> Result<TurnPipeline, EngineError> {
        let slots = settings.engine_slots;
        let pool = EnginePool::start(engine, slots)?;
        let limits = Limits {
            max_tokens: settings.n_ctx,
            // f32 K+V of a large model is well under 1 MiB per token.
            max_state_bytes: settings.n_ctx as u64 * (1 << 20),
        };
        let store = SnapshotStore::new(&settings.kv_dir, limits);
        // Writers killed mid-save leave per-process temp files that nothing else removes.
        match store.sweep_stale_tmp(std::time::Duration::from_secs(600)) {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(removed = n, dir = %settings.kv_dir.display(), "removed stale snapshot temp files")
            }
            Err(e) => {
                tracing::warn!(error = %e, dir = %settings.kv_dir.display(), "could not sweep snapshot temp files")
            }
        }
        Ok(TurnPipeline {
            pool,
            store,
            settings,
        })
    }

    pub fn engine(&self) -> &Arc<Engine> {
        self.pool.engine()
    }

    /// Steps 1–5 for a claimed turn; the worker does step 6 (fenced completion).
    pub async fn run_turn(
        &self,
        deps: &Deps,
        turn: &ClaimedTurn,
        abort: Arc<AtomicBool>,
    ) -> Result<(String, KvLog), TurnError> {
        let s = &self.settings;
        let path = if s.kv_only_enabled {
            TurnPath::KvOnly
        } else {
            TurnPath::Rollback
        };
        let mut log = KvLog::start(path, &turn.session_id, s.n_ctx);
        let engine = self.engine().clone();
        let tok: &dyn TokenCount = engine.as_ref();

        let hud_row = hud::fetch(&deps.pool, turn.character_id, &turn.user_id).await;
        let hud_line = hud::line_or_minimal(&hud_row, s.hud_max_tokens as usize, tok);
        let base_prompt = base_prompt(s, hud_row.as_ref().ok().and_then(|r| r.as_ref()));
        let digest = digest::current(
            &deps.pool,
            &turn.session_id,
            s.digest_max_tokens as usize,
            tok,
            &deps.metrics,
        )
        .await?;
        let last_done = crate::queue::last_done(&deps.pool, &turn.session_id)
            .await
            .map_err(|e| TurnError::retryable(e.to_string()))?;

        let scope = snapshot::scope_key(&turn.user_id, turn.character_id, &turn.session_id);
        let (snapshot, cold_reason) = if s.kv_only_enabled {
            self.load_snapshot(deps, turn, &scope, last_done).await
        } else {
            (None, Some("KV_ONLY_ENABLED=false".to_string()))
        };
        let history = if snapshot.is_none() {
            recent_history(&deps.pool, &turn.session_id).await?
        } else {
            Vec::new()
        };

        let job = TurnJob {
            base_prompt,
            hud: hud_line,
            digest: digest.clone(),
            user: turn.message.clone(),
            snapshot,
            history,
            tail: s.kv_tail_tokens,
            reply_max: s.reply_max_tokens,
            export: s.kv_only_enabled,
        };
        let abort2 = abort.clone();
        let run = self
            .pool
            .run(move |engine, ctx| run_in_context(engine, ctx, job, &abort2))
            .await
            .map_err(|e| TurnError::retryable(e.to_string()))?;
        let run = match run {
            Ok(run) => run,
            Err(e) if e.aborted => return Err(TurnError::Aborted),
            Err(e) if e.fatal => return Err(TurnError::fatal(e.message).with_log(log)),
            Err(e) => return Err(TurnError::retryable(e.message).with_log(log)),
        };

        log.loaded = run.warm;
        log.cold = !run.warm;
        log.cold_reason = if run.warm {
            None
        } else {
            cold_reason.or(run.cold_reason.clone())
        };
        log.tokens_loaded = run.tokens_loaded;
        log.tokens_in_kv = if s.kv_only_enabled {
            run.token_ids.len() as u32
        } else {
            0
        };
        log.digest_injected = run.digest_injected;
        log.digest_version = digest.version.clone();
        log.s_tokens = run.s_tokens;
        log.u_tokens = run.u_tokens;
        log.r_tokens = run.r_tokens;
        log.load_ms = run.load_ms;
        log.prefill_ms = run.stats.prefill_ms;
        log.ttft_ms = run.stats.ttft_ms;
        log.generate_ms = run.stats.generate_ms;
        if let Some(cold) = &log.cold_reason {
            event(
                &deps.pool,
                turn,
                "cold_start",
                serde_json::json!({ "reason": cold }),
            )
            .await;
        }

        if let Some(state) = &run.state {
            let saved_at = Instant::now();
            log.kv_bytes = state.len() as u64;
            log.bpt = if run.token_ids.is_empty() {
                0
            } else {
                (state.len() / run.token_ids.len()) as u32
            };
            if !self.save(deps, &scope, turn, &run, &abort).await {
                return Err(TurnError::Aborted);
            }
            log.save_ms = saved_at.elapsed().as_millis() as u64;
        }
        Ok((run.reply, log))
    }

    /// Reads and checks the session's snapshot. Any problem means a cold start, with the reason.
    async fn load_snapshot(
        &self,
        deps: &Deps,
        turn: &ClaimedTurn,
        scope: &str,
        last_done: Option<(i64, Option<i64>)>,
    ) -> (Option<Box<Snapshot>>, Option<String>) {
        let store = self.store.clone();
        let scope2 = scope.to_string();
        let loaded = match tokio::task::spawn_blocking(move || store.load(&scope2)).await {
            Ok(l) => l,
            Err(e) => return (None, Some(format!("snapshot load panicked: {e}"))),
        };
        let snap = match loaded {
            Loaded::Missing => return (None, Some("no snapshot".into())),
            Loaded::Unreadable(e) => {
                error!(error = %e, "snapshot unreadable");
                return (None, Some(format!("snapshot unreadable: {e}")));
            }
            Loaded::Corrupt { error, quarantined } => {
                warn!(%error, quarantined = ?quarantined, "snapshot corrupt; quarantined");
                event(
                    &deps.pool,
                    turn,
                    "snapshot_quarantined",
                    serde_json::json!({ "error": error.to_string(), "file": quarantined }),
                )
                .await;
                return (None, Some(format!("corrupt snapshot: {error}")));
            }
            Loaded::Found(snap) => snap,
        };
        if let Some(reason) = self.foreign(&snap.header) {
            // Valid, but made for another model, KV type, format or llama.cpp build: kept
            // aside for inspection, and the session starts over on this engine.
            let quarantined = self.store.quarantine(scope);
            info!(%reason, quarantined = ?quarantined, "snapshot header mismatch; cold start");
            event(
                &deps.pool,
                turn,
                "snapshot_quarantined",
                serde_json::json!({ "error": format!("header mismatch: {reason}"), "file": quarantined }),
            )
            .await;
            return (None, Some(format!("header mismatch: {reason}")));
        }
        if Some((snap.header.turn_id, Some(snap.header.fence))) != last_done {
            // Normal after a crash between save and commit (the file is fine, just not
            // current), and what a worker paused past its lease leaves behind: the same turn,
            // another attempt's token. Only the committing attempt's KV matches `messages`.
            let reason = format!(
                "stale: snapshot holds turn {} (fence {}), last committed turn is {}",
                snap.header.turn_id,
                snap.header.fence,
                match last_done {
                    Some((id, Some(token))) => format!("{id} (fence {token})"),
                    Some((id, None)) => format!("{id} (no fence recorded)"),
                    None => "none".to_string(),
                }
            );
            info!(%reason, "snapshot is not current; cold start");
            return (None, Some(reason));
        }
        (Some(snap), None)
    }

    /// Why a verified snapshot cannot be restored into this engine, if it cannot.
    fn foreign(&self, h: &Header) -> Option<String> {
        let engine = self.engine();
        let kv = self.settings.kv_type.as_str();
        if h.format_version != snapshot::FORMAT_VERSION {
            Some(format!(
                "format version {} != {}",
                h.format_version,
                snapshot::FORMAT_VERSION
            ))
        } else if h.model_sha != engine.model_sha {
            Some(format!(
                "model_sha {} != {}",
                short(&h.model_sha),
                short(&engine.model_sha)
            ))
        } else if h.type_k != kv || h.type_v != kv {
            Some(format!("KV type {}/{} != {kv}", h.type_k, h.type_v))
        } else if h.llama_build != LLAMA_BUILD {
            Some(format!(
                "llama.cpp build {} != {LLAMA_BUILD}",
                h.llama_build
            ))
        } else {
            None
        }
    }

    /// Writes the snapshot while this worker still holds the lease. A failed save is
    /// logged, never fatal: the next turn starts cold. Returns false when the lease is gone
    /// (the turn must stop: another worker owns the session).
    async fn save(
        &self,
        deps: &Deps,
        scope: &str,
        turn: &ClaimedTurn,
        run: &TurnRun,
        abort: &AtomicBool,
    ) -> bool {
        let Some(state) = run.state.clone() else {
            return true;
        };
        crate::faults::stop_point("before_save");
        let held = !abort.load(std::sync::atomic::Ordering::Relaxed)
            && crate::queue::lease_held(&deps.pool, turn)
                .await
                .unwrap_or_else(|e| {
                    warn!(error = %e, "could not check the lease before saving; not saving");
                    false
                });
        if !held {
            warn!("lease lost before the snapshot save; the session's snapshot is left alone");
            return false;
        }
        let mut header = Header {
            format_version: snapshot::FORMAT_VERSION,
            model_sha: self.engine().model_sha.clone(),
            digest_version: run.kv_digest_version.clone(),
            crc32c: 0,
            tokens: 0,
            bytes: 0,
            stored_bytes: 0,
            timestamp: chrono::Utc::now().timestamp().max(0) as u64,
            llama_build: LLAMA_BUILD.to_string(),
            n_ctx: self.settings.n_ctx,
            type_k: self.settings.kv_type.as_str().to_string(),
            type_v: self.settings.kv_type.as_str().to_string(),
            compression: if self.settings.kv_compress {
                Compression::Zstd
            } else {
                Compression::None
            },
            scope: scope.to_string(),
            turn_id: turn.id.0,
            fence: turn.fencing_token,
            segments: run.segments.clone(),
        };
        let (store, scope, tokens) = (self.store.clone(), scope.to_string(), run.token_ids.clone());
        let result = tokio::task::spawn_blocking(move || {
            let file = snapshot::encode(&mut header, &tokens, &state)?;
            store.save_with(&scope, &file, &crate::faults::stop_point)
        })
        .await;
        match result {
            Ok(Ok(_)) => crate::faults::stop_point("after_save"),
            Ok(Err(e)) => error!(error = %e, "snapshot save failed; the next turn will start cold"),
            Err(e) => error!(error = %e, "snapshot save panicked; the next turn will start cold"),
        }
        true
    }

    /// Seed step 6: rebuild the digest from the database after the turn.
    pub async fn after_turn(&self, deps: &Deps, turn: &ClaimedTurn) {
        let tok: &dyn TokenCount = self.engine().as_ref();
        if let Err(e) = digest::rebuild(
            &deps.pool,
            &turn.session_id,
            self.settings.digest_max_tokens as usize,
            tok,
            &deps.metrics,
        )
        .await
        {
            warn!(error = %e, "post-turn digest rebuild failed; the rebuilder will retry");
        }
    }

    /// The digest rebuilder (LISTEN/NOTIFY, dirty markers, expiry).
    pub fn spawn_background(
        &self,
        deps: &Deps,
        tasks: &mut JoinSet<()>,
        shutdown: CancellationToken,
    ) {
        let tok: Arc<dyn TokenCount> = self.engine().clone();
        tasks.spawn(digest::run_rebuilder(
            deps.pool.clone(),
            tok,
            self.settings.digest_max_tokens as usize,
            std::time::Duration::from_millis(self.settings.poll_ms.max(100)),
            deps.metrics.clone(),
            shutdown,
        ));
    }
}

fn short(sha: &str) -> &str {
    &sha[..sha.len().min(12)]
}

/// The base system prompt, filled from the character row.
fn base_prompt(s: &Settings, row: Option<&hud::HudRow>) -> String {
    let (name, persona) = row.map_or(("the character", ""), |r| {
        (r.name.as_str(), r.persona.as_str())
    });
    let text = s
        .base_prompt
        .replace("{name}", name)
        .replace("{persona}", persona);
    digest::canonicalize(&text)
}

/// The session's recent exchanges, oldest first.
async fn recent_history(
    pool: &PgPool,
    session_id: &str,
) -> Result<Vec<(String, String)>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT u.content AS user_text, a.content AS reply_text
           FROM (SELECT turn_id, content FROM messages
                  WHERE session_id = $1 AND role = 'user'
                  ORDER BY turn_id DESC LIMIT $2) u
           JOIN messages a ON a.turn_id = u.turn_id AND a.role = 'assistant'
          ORDER BY u.turn_id",
    )
    .bind(session_id)
    .bind(HISTORY_MESSAGES / 2)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| Ok((r.try_get("user_text")?, r.try_get("reply_text")?)))
        .collect()
}

async fn event(pool: &PgPool, turn: &ClaimedTurn, kind: &str, detail: serde_json::Value) {
    let r = sqlx::query(
        "INSERT INTO events (session_id, turn_id, kind, detail) VALUES ($1, $2, $3, $4)",
    )
    .bind(&turn.session_id)
    .bind(turn.id.0)
    .bind(kind)
    .bind(detail)
    .execute(pool)
    .await;
    if let Err(e) = r {
        warn!(error = %e, kind, "event not recorded");
    }
}
