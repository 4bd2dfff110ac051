//! Seed 000's turn pipeline on llama.cpp. [`TurnPipeline::run_turn`] reads as steps 2–6
//! of shared/DESIGN.md's eight: (2) load the KV (`load.rs`) while the inputs are gathered
//! (HUD, digest, and from the memory layers the context block, recall candidates and
//! in-chat commands: [`recall`], [`commands`]), (3–5) prune, build the context and generate
//! on an engine thread ([`kv`]), (6) save the snapshot (`save.rs`). The runner claims (1),
//! completes under the fence (7), then [`TurnPipeline::after_turn`] rebuilds the digest (8).
//! Steps 2 and 6 are plain functions over the turn's `TurnCtx`, not methods: this file
//! alone holds `impl TurnPipeline`. Nothing here asks the queue: what the turn needs of it
//! (the last committed turn, the lease) came with the claim.

mod batch;
pub mod commands;
mod event;
pub mod history;
pub mod kv;
mod load;
pub mod memory_line;
pub mod recall;
pub mod reply_stream;
mod save;
mod turn_ctx;

use std::sync::Arc;
use std::time::Instant;

use sqlx::PgPool;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::config::Settings;
use crate::context::digest;
use crate::context::hud;
use crate::context::tokens::TokenCount;
use crate::engine::{Engine, EngineError, EnginePool};
use crate::memory::MemoryService;
use crate::metrics::Metrics;
use crate::services::Services;
use crate::snapshot::{self, SnapshotStore};
use crate::stream::Publisher;
use crate::turn::log::{KvLog, TurnPath};
use crate::turn::{ClaimedTurn, KvRecord, Lease, MemoryOp, TurnError, TurnOptions, TurnOutput};
use event::event;
use kv::{KvOutcome, Start, TurnJob, TurnRun};
use turn_ctx::TurnCtx;

/// How long a finished turn waits at most for its reply's last delta to be published
/// (it is, long before the save is done; a stalled publisher must not hold a turn).
const STREAM_FLUSH_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The llama.cpp generator: engine threads, snapshot store, settings and the database.
pub struct TurnPipeline {
    pub engines: Arc<EnginePool>,
    /// Forms batches of sessions decoded together; started on the first turn, inside the
    /// runtime, and only when `KVMEM_BATCH_SESSIONS` is above 1.
    batcher: std::sync::OnceLock<batch::Batcher>,
    pub store: SnapshotStore,
    pub settings: Arc<Settings>,
    db: PgPool,
    metrics: Arc<Metrics>,
    /// Recall's retrieval (the query embedder and the search), made on the first turn.
    memory: tokio::sync::OnceCell<Option<MemoryService>>,
    /// Where `memory` comes from: the composition root's services.
    services: Arc<dyn Services>,
    /// Publishes replies as they are generated; started on the first turn, inside the
    /// runtime, when `stream_deltas` is on.
    publisher: std::sync::OnceLock<Publisher>,
}

/// What a turn reads before it touches the KV.
pub(super) struct Inputs {
    base_prompt: String,
    hud: String,
    digest: digest::Stored,
    context: recall::ContextBlock,
    recalled: recall::Recalled,
    /// An in-chat command's answer, which opens the reply, and what it queues.
    reply_prefix: String,
    memory_ops: Vec<MemoryOp>,
}

impl TurnPipeline {
    pub fn new(
        engine: Arc<Engine>,
        settings: Arc<Settings>,
        db: PgPool,
        metrics: Arc<Metrics>,
        store: SnapshotStore,
        services: Arc<dyn Services>,
    ) -> Result<TurnPipeline, EngineError> {
        let engines = Arc::new(EnginePool::start(
            engine,
            settings.engine.slots,
            settings.engine.batch_sessions,
        )?);
        // Writers killed mid-save leave per-process temp files that nothing else removes.
        match store
            .files()
            .sweep_stale_tmp(std::time::Duration::from_secs(600))
        {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(removed = n, dir = %settings.snapshot.dir.display(), "removed stale snapshot temp files")
            }
            Err(e) => {
                tracing::warn!(error = %e, dir = %settings.snapshot.dir.display(), "could not sweep snapshot temp files")
            }
        }
        Ok(TurnPipeline {
            engines,
            batcher: std::sync::OnceLock::new(),
            store,
            settings,
            db,
            metrics,
            memory: tokio::sync::OnceCell::new(),
            services,
            publisher: std::sync::OnceLock::new(),
        })
    }

    pub fn engine(&self) -> &Arc<Engine> {
        self.engines.engine()
    }

    /// The `path=` this pipeline logs.
    pub fn path(&self) -> TurnPath {
        if self.settings.turn.kv_only_enabled {
            TurnPath::KvOnly
        } else {
            TurnPath::Rollback
        }
    }

    /// Steps 2–6 of shared/DESIGN.md's eight for a claimed turn, while `lease` is held:
    /// the runner claimed it (1), and completes it (7) and rebuilds the digest (8) after.
    pub async fn run_turn(
        &self,
        turn: &ClaimedTurn,
        lease: &Lease,
    ) -> Result<TurnOutput, TurnError> {
        let s = &self.settings;
        let turn_started = Instant::now();
        let mut log = KvLog::start(self.path(), &turn.session_id, s.engine.n_ctx);
        let scope = snapshot::scope_key(&turn.user_id, turn.character_id, &turn.session_id);
        let cx = self.ctx(turn, &scope, lease);
        // 2. Load KV: a trusted snapshot, or how a cold start rebuilds the dialogue. The
        // turn's inputs are read meanwhile: together they take as long as the slower, which
        // is the time to first token.
        let (inputs, loaded) = tokio::join!(self.inputs(turn), load::load(&cx));
        let inputs = inputs?;
        let (file, source) = loaded.unzip();
        let (start, mut cold_reason) = load::start(&cx, &inputs.base_prompt, file).await?;
        if matches!(start, Start::Snapshot(_)) {
            log.kv_source = source.map(snapshot::Source::as_str);
        }

        // 3–5. Prune to the tail, build the context (HUD, digest when due, recall, the
        // message) and generate, on an engine thread: `kv::run_in_context` in that order.
        let job = self.build(turn, &inputs)?;
        // What the turn spent before its engine thread (inputs, recall, snapshot read)
        // counts towards its time to first token.
        let before_engine_ms = turn_started.elapsed().as_millis() as u64;
        let stream = job.stream.clone();
        let mut outcome = self.generate(job.clone(), start, lease, &log).await?;
        if let KvOutcome::Refused(why) = outcome {
            let (start, reason) = load::cold_start(&cx, &inputs.base_prompt, why).await?;
            cold_reason = reason;
            outcome = self.generate(job, start, lease, &log).await?;
        }
        let run = match outcome {
            KvOutcome::Ran(run) => run,
            KvOutcome::Refused(why) => {
                return Err(TurnError::retryable(format!("cold start refused: {why}")))
            }
        };
        self.record(&mut log, turn, &run, cold_reason, &inputs)
            .await;
        log.ttft_ms += before_engine_ms;

        // 6. Save the pruned KV, while the lease is still ours.
        save::save_state(&cx, &mut log, &run).await?;
        let run = *run;
        if let Some(stream) = &stream {
            // The commit's end message must not overtake the reply's last delta.
            stream.flushed(STREAM_FLUSH_WAIT).await;
        }
        let mut memory_ops = inputs.memory_ops;
        memory_ops.extend(run.memory_line.map(MemoryOp::Line));
        Ok(TurnOutput {
            reply: run.reply,
            log,
            kv: Some(KvRecord {
                model_sha: self.engine().model_sha.clone(),
                token_ids: run.token_ids,
                segments: run.segments,
                digest_version: run.kv_digest_version,
            }),
            memory_ops,
        })
    }

    /// Step 4's plan, which the engine thread carries out: what it runs for `turn`, its
    /// inputs within the settings' budgets and its own sampling, with a stream target when
    /// replies are streamed. Options the SQL API admitted always read back; a row that does
    /// not is no attempt's to fix.
    fn build(&self, turn: &ClaimedTurn, inputs: &Inputs) -> Result<TurnJob, TurnError> {
        let s = &self.settings;
        let options = TurnOptions::from_row(turn.options.as_ref())
            .map_err(|e| TurnError::fatal(e.to_string()))?;
        Ok(TurnJob {
            turn_id: turn.id.0,
            base_prompt: inputs.base_prompt.clone(),
            hud: inputs.hud.clone(),
            digest: inputs.digest.clone(),
            context: inputs.context.clone(),
            recall: inputs.recalled.items.clone(),
            recall_max: s.memory.max_tokens,
            user: turn.message.clone(),
            reply_prefix: inputs.reply_prefix.clone(),
            tail: s.turn.kv_tail_tokens,
            reply_max: options.reply_max(s.turn.reply_max_tokens),
            sampling: options.sampling(),
            export: s.turn.kv_only_enabled,
            stream: s.turn.stream_deltas.then(|| {
                self.publisher
                    .get_or_init(|| Publisher::spawn(self.db.clone()))
                    .target(turn.id.0, turn.fencing_token, &turn.session_id)
            }),
        })
    }

    /// Steps 2 and 6 (`load.rs`, `save.rs`) get only the parts of the pipeline they use,
    /// so that they are plain functions that do not depend on `TurnPipeline`.
    fn ctx<'a>(&'a self, turn: &'a ClaimedTurn, scope: &'a str, lease: &'a Lease) -> TurnCtx<'a> {
        TurnCtx {
            db: &self.db,
            store: &self.store,
            engine: self.engine(),
            settings: &self.settings,
            turn,
            scope,
            lease,
        }
    }

    /// The character's HUD line and base prompt, the session's current digest, the context
    /// block, and what memory adds (an in-chat command's answer, recall). The reads are
    /// independent but for recall, which follows the command so a `forget` is already
    /// carried out when recall runs; they run together.
    async fn inputs(&self, turn: &ClaimedTurn) -> Result<Inputs, TurnError> {
        let s = &self.settings;
        let tok: &dyn TokenCount = self.engine().as_ref();
        let memory = async {
            let memory = self.memory().await;
            let (reply_prefix, memory_ops) = match (memory, commands::parse(&turn.message)) {
                (Some(svc), Some(cmd)) => commands::carry_out(svc, turn, cmd).await,
                _ => (String::new(), Vec::new()),
            };
            let recalled = match memory {
                Some(svc) if s.memory.max_tokens > 0 => {
                    recall::gather(svc, turn, &turn.message).await
                }
                _ => recall::Recalled::default(),
            };
            (reply_prefix, memory_ops, recalled)
        };
        let (hud_row, digest, context, (reply_prefix, memory_ops, recalled)) = tokio::join!(
            hud::fetch(&self.db, turn.character_id, &turn.user_id),
            digest::current(
                &self.db,
                &turn.session_id,
                s.turn.digest_max_tokens as usize,
                tok,
                &self.metrics,
            ),
            self.context(turn),
            memory,
        );
        let hud = hud::line_or_minimal(&hud_row, s.turn.hud_max_tokens as usize, tok);
        let base_prompt = base_prompt(s, hud_row.as_ref().ok().and_then(|r| r.as_ref()));
        Ok(Inputs {
            base_prompt,
            hud,
            digest: digest?,
            context: context?,
            recalled,
            reply_prefix,
            memory_ops,
        })
    }

    /// The context block from what the summary lane stored, within SUMMARY_MAX_TOKENS.
    async fn context(&self, turn: &ClaimedTurn) -> Result<recall::ContextBlock, TurnError> {
        let max = self.settings.summary.max_tokens as usize;
        if max == 0 {
            return Ok(recall::ContextBlock::default());
        }
        let parts = recall::context_parts(&self.db, turn)
            .await
            .map_err(|e| TurnError::retryable_from("reading the context block", e))?;
        let engine = self.engine().clone();
        Ok(recall::context_block(&parts, max, &|t| {
            engine.count_tokens(t)
        }))
    }

    /// The memory service recall and in-chat commands use; `None` if it cannot be made
    /// (bad memory settings), which turns both off with a warning.
    async fn memory(&self) -> Option<&MemoryService> {
        self.memory
            .get_or_init(|| async {
                match self.services.memory().await {
                    Ok(svc) => Some(svc),
                    Err(e) => {
                        warn!(error = %e, "recall and in-chat memory commands off: bad memory settings");
                        None
                    }
                }
            })
            .await
            .as_ref()
    }

    /// Steps 3–5 on an engine thread; a failure carries the log so far.
    async fn generate(
        &self,
        job: TurnJob,
        start: Start,
        lease: &Lease,
        log: &KvLog,
    ) -> Result<KvOutcome, TurnError> {
        let abort = lease.abort_flag().clone();
        let ran = if self.engines.batch_sessions() > 1 {
            let wait = std::time::Duration::from_millis(self.settings.engine.batch_wait_ms);
            self.batcher
                .get_or_init(|| {
                    batch::Batcher::start(self.engines.clone(), wait, self.metrics.clone())
                })
                .run(job, start, abort)
                .await
        } else {
            self.engines
                .run(move |engine, ctx| kv::run_in_context(engine, ctx, job, start, &abort))
                .await
                .map_err(TurnError::from)
                .and_then(|r| r)
        };
        ran.map_err(|e| e.with_log(log.clone()))
    }

    /// Fills the turn's log from the run, and records a cold start as an event.
    async fn record(
        &self,
        log: &mut KvLog,
        turn: &ClaimedTurn,
        run: &TurnRun,
        cold_reason: Option<String>,
        inputs: &Inputs,
    ) {
        log.loaded = run.warm;
        log.cold = !run.warm;
        if !run.warm {
            log.kv_source = None;
        }
        log.rebuild = run.rebuild;
        log.cold_reason = if run.warm {
            None
        } else {
            cold_reason.or_else(|| Some("no snapshot".to_string()))
        };
        log.tokens_loaded = run.tokens_loaded;
        log.tokens_in_kv = if self.settings.turn.kv_only_enabled {
            run.token_ids.len() as u32
        } else {
            0
        };
        log.digest_injected = run.digest_injected;
        log.digest_version = inputs.digest.version.clone();
        log.m_tokens = run.m_tokens;
        log.memories_injected = run.recalled.len() as u32;
        log.memory_keys = run.recalled.clone();
        log.recall_in_kv = run.recall_in_kv;
        log.recall_ms = inputs.recalled.ms;
        log.context_injected = run.context_injected;
        log.c_tokens = run.c_tokens;
        log.context_version = if run.context_injected && inputs.context.content.is_empty() {
            kv::CLEARED_CONTEXT.to_string()
        } else {
            inputs.context.version.clone()
        };
        log.s_tokens = run.s_tokens;
        log.u_tokens = run.u_tokens;
        log.r_tokens = run.r_tokens;
        log.finish_reason = Some(run.finish);
        log.load_ms = run.load_ms;
        log.prefill_ms = run.stats.prefill_ms;
        log.prefill_tokens = run.prefill_tokens;
        log.prompt_tokens = run.prompt_tokens;
        log.hud_kept = run.hud_kept;
        log.ttft_ms = run.stats.ttft_ms;
        log.generate_ms = run.stats.generate_ms;
        log.redecode_ms = run.stats.redecode_ms;
        if let Some(cold) = &log.cold_reason {
            event(
                &self.db,
                turn,
                "cold_start",
                serde_json::json!({ "reason": cold }),
            )
            .await;
        }
    }

    /// Step 8, after the turn committed: rebuild the digest from the database.
    pub async fn after_turn(&self, turn: &ClaimedTurn) {
        let tok: &dyn TokenCount = self.engine().as_ref();
        if let Err(e) = digest::rebuild(
            &self.db,
            &turn.session_id,
            self.settings.turn.digest_max_tokens as usize,
            tok,
            &self.metrics,
        )
        .await
        {
            warn!(error = %e, "post-turn digest rebuild failed; the rebuilder will retry");
        }
    }

    /// The digest rebuilder (LISTEN/NOTIFY, dirty markers, expiry).
    pub fn spawn_background(&self, tasks: &mut JoinSet<()>, shutdown: CancellationToken) {
        let tok: Arc<dyn TokenCount> = self.engine().clone();
        tasks.spawn(digest::run_rebuilder(
            self.db.clone(),
            tok,
            self.settings.turn.digest_max_tokens as usize,
            std::time::Duration::from_millis(self.settings.queue.poll_ms.max(100)),
            self.metrics.clone(),
            shutdown,
        ));
    }
}

/// The base system prompt, filled from the character row.
fn base_prompt(s: &Settings, row: Option<&hud::HudRow>) -> String {
    let (name, persona) = row.map_or(("the character", ""), |r| {
        (r.name.as_str(), r.persona.as_str())
    });
    let text = s
        .turn
        .base_prompt
        .replace("{name}", name)
        .replace("{persona}", persona);
    digest::canonicalize(&text)
}
