//! Chaos: `kvmem worker` processes are killed with SIGKILL at random moments while turns
//! run, and the database must still keep the queue's promise: every enqueued turn is
//! answered exactly once, in session order, whatever happens to workers.
//!
//! - `chaos_echo` (CI): 4 echo workers (4 slots each, 5 ms per reply so kills land
//!   mid-claim, mid-generation and mid-completion), 90 sessions × 20 turns, 30 kills at
//!   random moments 80–400 ms apart (the work lasts about as long as the killing).
//! - `chaos_llama` (CI): 2 llama workers on the tiny model sharing one KV directory,
//!   7 sessions × 6 turns, 6 timed kills plus aimed ones, at least 3 of each kind and
//!   required: a worker started with `KVMEM_TEST_STOP_AT` stops itself mid snapshot write
//!   (half the bytes in its `.tmp` file) or after the rename and before the completion's
//!   commit, and is SIGKILLed there. Every turn killed after its save must later start
//!   cold with a stale snapshot. Afterwards every `.llkv` must decode and hold its
//!   session's last turn, and one more turn per session must succeed on a fresh worker.
//! - `KVMEM_CHAOS_LONG=1` (what `ops/chaos` runs) scales both up: echo 6 workers,
//!   200 sessions × 50 turns, 200 kills; llama 3 workers, 24 sessions × 20 turns, 40 timed
//!   kills plus at least 15 aimed kills of each kind.
//! - `KVMEM_CHAOS_SEED=N` picks another kill schedule. The seeded RNG chooses victims and
//!   moments; the machine's timing still varies from run to run, so a run is not a replay.
//!
//! Turns are enqueued through `kvmem::queue::enqueue`: backlog sessions get all their turns
//! before the workers start (every worker always has work, so kills land on turns in
//! flight); trickle sessions get one turn per round while the killing goes on, so their
//! queues run dry and refill and enqueues race with completions and reaps on the session's
//! head pointer. `max_attempts` is raised to 100 first: the checks are about loss and
//! duplication, not retry limits.
//!
//! What is checked, against the database, once every turn is final and the workers are
//! stopped with SIGTERM:
//! - every turn is `done`, with the messages enqueued, in enqueue order;
//! - exactly once: per turn one `user` and one `assistant` row in `messages` holding the
//!   message and the reply, one `turn_log` row with status OK whose attempt is the turn's
//!   last counted attempt (nothing claimed it after it succeeded), `messages` has exactly
//!   two rows per turn; echo replies are `echo: <message>`;
//! - order: per session, OK `turn_log` rows by `started_at`, and assistant rows by
//!   `messages.id` (commit order), have increasing turn ids;
//! - no overlap: per session, each successful attempt starts after the previous one's
//!   completion, judged on OK `turn_log` rows: `started_at` is the worker's clock once its
//!   claim returned, `finished_at` the completion transaction's start (same host clock).
//!   Not on `turns.started_at`: that is the claim's `now()`, the transaction start, which
//!   can precede the claim's snapshot by the planning time (a few ms on a freshly
//!   connected worker, seen in practice), so it is no evidence of an overlap. Killed
//!   attempts write no `turn_log` row, so they are judged while they live instead: every
//!   ~250 ms a sampler checks, in one snapshot, that each running turn holds its session's
//!   lease, that no lease is held without a running turn, and that every free session
//!   points at its oldest queued turn (a session that does not is a lost turn);
//! - no worker exits by itself (each unexpected exit is reported with its log and the
//!   worker restarted, so the run goes on), and each exits cleanly on SIGTERM (one just
//!   restarted may still be starting and die of the signal itself: counted, see
//!   `Fleet::stop`).
//!
//! "Kills with a running turn" counts kills after which the database still showed a
//! running turn whose `worker_id` (`host:pid:hex`) has the killed process's pid.
//! Worker logs go to `$CARGO_TARGET_TMPDIR/chaos/<test>/`.

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use common::*;
use harness::Stats;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sqlx::PgPool;

const SIGTERM: i32 = 15;

/// The two tests load the machine fully; they run one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn long_run() -> bool {
    std::env::var("KVMEM_CHAOS_LONG").is_ok_and(|v| !v.is_empty() && v != "0")
}

fn seed(default: u64) -> u64 {
    std::env::var("KVMEM_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn log_dir(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("chaos")
        .join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

// ---------------------------------------------------------------------------------------
// Worker processes

#[derive(Clone)]
enum Gen {
    Echo { delay_ms: u64, concurrency: u32 },
    Llama { kv_dir: PathBuf },
}

/// The worker processes of one test. Dropping it SIGKILLs whatever still runs, so no
/// worker outlives the test, whether it passes or panics.
struct Fleet {
    url: String,
    generator: Gen,
    log_dir: PathBuf,
    slots: Vec<Option<Child>>,
    logs: Vec<PathBuf>,
    /// The `KVMEM_TEST_STOP_AT` point each slot's next process stops itself at.
    aims: Vec<Option<&'static str>>,
    started: usize,
}

impl Fleet {
    fn new(url: &str, generator: Gen, log_dir: &Path, workers: usize) -> Fleet {
        Fleet::aimed(url, generator, log_dir, vec![None; workers])
    }

    /// Workers whose processes stop themselves at the given points (one slot each).
    fn aimed(url: &str, generator: Gen, log_dir: &Path, aims: Vec<Option<&'static str>>) -> Fleet {
        let workers = aims.len();
        let mut fleet = Fleet {
            url: url.to_string(),
            generator,
            log_dir: log_dir.to_path_buf(),
            slots: (0..workers).map(|_| None).collect(),
            logs: vec![PathBuf::new(); workers],
            aims,
            started: 0,
        };
        for slot in 0..workers {
            fleet.start(slot);
        }
        fleet
    }

    fn start(&mut self, slot: usize) {
        assert!(self.slots[slot].is_none(), "slot {slot} is running");
        self.started += 1;
        let log = self
            .log_dir
            .join(format!("{:04}-slot{slot}.log", self.started));
        let out = File::create(&log).expect("worker log file");
        let err = out.try_clone().expect("worker log file");
        let mut cmd = kvmem_command(&self.url);
        cmd.arg("worker")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        match &self.generator {
            Gen::Echo {
                delay_ms,
                concurrency,
            } => {
                cmd.args([
                    "--generator",
                    "echo",
                    "--concurrency",
                    &concurrency.to_string(),
                    "--echo-delay-ms",
                    &delay_ms.to_string(),
                ]);
            }
            Gen::Llama { kv_dir } => {
                cmd.args(["--generator", "llama"])
                    .env("KVMEM_MODEL_PATH", tiny_model())
                    .env("KVMEM_KV_DIR", kv_dir)
                    .env("N_CTX", "1024")
                    .env("KV_TAIL_TOKENS", "256")
                    .env("REPLY_MAX_TOKENS", "16")
                    // Two or three processes on a small machine: one thread each.
                    .env("KVMEM_N_THREADS", "1");
            }
        }
        if let Some(point) = self.aims[slot] {
            cmd.env("KVMEM_TEST_STOP_AT", point);
        }
        self.slots[slot] = Some(cmd.spawn().expect("start kvmem worker"));
        self.logs[slot] = log;
    }

    /// The pid and stop point of a slot whose worker has stopped itself at its point.
    fn stopped(&self, slot: usize) -> Option<(u32, &'static str)> {
        let pid = self.slots[slot].as_ref()?.id();
        let point = self.aims[slot]?;
        (proc_state(pid) == Some('T')).then_some((pid, point))
    }

    fn len(&self) -> usize {
        self.slots.len()
    }

    /// SIGKILL and reap; returns the pid.
    fn kill(&mut self, slot: usize) -> Option<u32> {
        let mut child = self.slots[slot].take()?;
        let pid = child.id();
        let _ = child.kill();
        let _ = child.wait();
        Some(pid)
    }

    /// Workers that exited without being killed, as reports; their slots are free again.
    fn exited_by_themselves(&mut self) -> Vec<(usize, String)> {
        let mut out = Vec::new();
        for slot in 0..self.slots.len() {
            let Some(child) = self.slots[slot].as_mut() else {
                continue;
            };
            if let Ok(Some(status)) = child.try_wait() {
                let pid = child.id();
                self.slots[slot] = None;
                out.push((
                    slot,
                    format!(
                        "worker pid {pid} (slot {slot}) exited by itself: {status}; log {}:\n{}",
                        self.logs[slot].display(),
                        tail(&self.logs[slot], 15)
                    ),
                ));
            }
        }
        out
    }

    /// SIGTERM to every worker, then wait for each to exit. Returns complaints.
    ///
    /// A worker that dies *of* the signal got it before it installed its handler (the
    /// worker does that once connected and migrated, and keeps it for life): it was still
    /// starting, with nothing claimed. That is counted, not a complaint. A worker whose
    /// handler ran must exit 0.
    async fn stop(&mut self, grace: Duration, stats: &mut Stats) -> Vec<String> {
        let mut complaints = Vec::new();
        for child in self.slots.iter().flatten() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
        }
        let deadline = Instant::now() + grace;
        for slot in 0..self.slots.len() {
            let Some(mut child) = self.slots[slot].take() else {
                continue;
            };
            loop {
                match child.try_wait() {
                    Ok(Some(status)) => {
                        if status.signal() == Some(SIGTERM) {
                            stats.sigterm_while_starting += 1;
                        } else if !status.success() {
                            complaints.push(format!(
                                "worker pid {} (slot {slot}) ended with {status} on SIGTERM; log {}:\n{}",
                                child.id(),
                                self.logs[slot].display(),
                                tail(&self.logs[slot], 15)
                            ));
                        }
                        break;
                    }
                    Ok(None) if Instant::now() < deadline => {
                        // A worker stopped at its stop point only sees SIGTERM once continued.
                        if proc_state(child.id()) == Some('T') {
                            let _ = Command::new("kill")
                                .args(["-CONT", &child.id().to_string()])
                                .status();
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    _ => {
                        let _ = child.kill();
                        let _ = child.wait();
                        complaints.push(format!(
                            "worker pid {} (slot {slot}) ignored SIGTERM for {grace:?}; log {}",
                            child.id(),
                            self.logs[slot].display()
                        ));
                        break;
                    }
                }
            }
        }
        complaints
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for child in self.slots.iter_mut().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The process state letter from /proc (`T` = stopped).
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

// ---------------------------------------------------------------------------------------
// The plan, the enqueuer and the killer

struct Plan {
    name: &'static str,
    /// Backlog sessions: all their turns are queued before the workers start, so every
    /// worker always has work and kills land on turns in flight.
    sessions: usize,
    /// Trickle sessions: one turn each per round while the killing goes on, so their queues
    /// run dry and refill, and enqueues race with completions and reaps on the head pointer.
    trickle: usize,
    turns: usize,
    /// Kills on a timer, at a random moment `kill_gap_ms` after the previous one.
    kills: usize,
    kill_gap_ms: (u64, u64),
    /// Kills aimed at snapshot writes in this directory (llama only), at most this many.
    snipe: Option<(PathBuf, usize)>,
    drain_timeout: Duration,
}

impl Plan {
    /// Trickle rounds are spread over ~80% of the expected killing time.
    fn round_gap(&self) -> Duration {
        let mean = (self.kill_gap_ms.0 + self.kill_gap_ms.1) / 2;
        Duration::from_millis(self.kills as u64 * mean * 8 / 10 / self.turns.max(1) as u64)
    }

    fn all_sessions(&self) -> std::ops::Range<usize> {
        0..self.sessions + self.trickle
    }

    fn expected(&self) -> BTreeMap<String, Vec<String>> {
        self.all_sessions()
            .map(|s| {
                (
                    session_id(s),
                    (0..self.turns).map(|t| message(s, t)).collect(),
                )
            })
            .collect()
    }
}

fn session_id(s: usize) -> String {
    format!("chaos-{s:03}")
}

fn message(s: usize, t: usize) -> String {
    format!("session {s} turn {t}: where do we go from here?")
}

async fn enqueue(pool: &PgPool, owners: &[(String, i64)], s: usize, t: usize) -> i64 {
    let (user, ch) = &owners[s % owners.len()];
    kvmem::queue::enqueue(pool, &session_id(s), user, *ch, &message(s, t), None)
        .await
        .unwrap_or_else(|e| panic!("enqueue session {s} turn {t}: {e}"))
        .0
}

/// The backlog, round by round so turn ids interleave across sessions.
async fn enqueue_backlog(pool: &PgPool, plan: &Plan, owners: &[(String, i64)]) {
    for t in 0..plan.turns {
        for s in 0..plan.sessions {
            enqueue(pool, owners, s, t).await;
        }
    }
}

/// The trickle sessions' turns, a round at a time on a jittered schedule.
fn spawn_trickle(
    pool: &PgPool,
    plan: &Plan,
    owners: &[(String, i64)],
    seed: u64,
) -> tokio::task::JoinHandle<()> {
    let (pool, owners) = (pool.clone(), owners.to_vec());
    let (sessions, turns, gap) = (
        plan.sessions..plan.sessions + plan.trickle,
        plan.turns,
        plan.round_gap(),
    );
    tokio::spawn(async move {
        let mut rng = StdRng::seed_from_u64(seed);
        let start = tokio::time::Instant::now();
        for t in 0..turns {
            // On a schedule, so slow enqueues on a loaded machine do not add up.
            let at = start + gap.mul_f64(t as f64 + rng.gen_range(0.5..1.5));
            tokio::time::sleep_until(at).await;
            for s in sessions.clone() {
                enqueue(&pool, &owners, s, t).await;
            }
        }
    })
}

async fn progress(pool: &PgPool) -> (i64, i64, i64) {
    sqlx::query_as(
        "SELECT count(*) FILTER (WHERE state = 'done'),
                count(*) FILTER (WHERE state IN ('queued', 'running')),
                count(*) FILTER (WHERE state = 'running')
           FROM turns",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// `.<scope>.<pid>.tmp` files in the KV directory, with their pid.
fn tmp_files(dir: &Path) -> Vec<(PathBuf, u32)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            let pid = name
                .strip_suffix(".tmp")?
                .rsplit('.')
                .next()?
                .parse()
                .ok()?;
            Some((e.path(), pid))
        })
        .collect()
}

mod harness;
mod runs;
mod upgrade;
