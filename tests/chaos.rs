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

mod common;

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use common::*;
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

#[derive(Default)]
struct Stats {
    kills: usize,
    timer_kills: usize,
    /// Kills after which a turn of the killed pid was still `running` in the database.
    kills_busy: usize,
    /// Turns left running by killed workers, summed over kills.
    stranded: i64,
    /// Kills aimed at a snapshot write in progress (its `.tmp` file was seen).
    snipes: usize,
    /// ... whose `.tmp` file was still there after the process died: killed mid-write.
    snipes_mid_write: usize,
    /// Kills right after a snapshot's rename, aimed between the save and the commit.
    post_save: usize,
    /// ... whose turn was still running after the process died: killed before the commit.
    post_save_before_commit: usize,
    /// The turns those kills left running: each one's next attempt must find the snapshot stale.
    post_save_turns: Vec<i64>,
    crashes: Vec<String>,
    /// Workers that got the final SIGTERM before installing their handler (see `Fleet::stop`).
    sigterm_while_starting: usize,
    violations: Vec<String>,
    samples: usize,
}

impl Stats {
    /// Counts a kill; returns the turns the killed process left running.
    async fn record_kill(&mut self, pool: &PgPool, pid: u32) -> Vec<i64> {
        self.kills += 1;
        let running: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM turns WHERE state = 'running' AND worker_id LIKE $1",
        )
        .bind(format!("%:{pid}:%"))
        .fetch_all(pool)
        .await
        .unwrap();
        if !running.is_empty() {
            self.kills_busy += 1;
            self.stranded += running.len() as i64;
        }
        running
    }

    fn restart_crashed(&mut self, fleet: &mut Fleet) {
        for (slot, report) in fleet.exited_by_themselves() {
            eprintln!("{report}");
            self.crashes.push(report);
            fleet.start(slot);
        }
    }

    /// Queue invariants, read in one snapshot. Any hit is recorded with its rows.
    async fn sample(&mut self, pool: &PgPool) {
        self.samples += 1;
        let rows: Vec<String> = sqlx::query_scalar(
            "SELECT format('running turn %s of %s by %s without its lease (lease turn %s owner %s)',
                           t.id, t.session_id, t.worker_id, l.turn_id, l.owner)
               FROM turns t LEFT JOIN session_locks l USING (session_id)
              WHERE t.state = 'running'
                AND (l.turn_id IS DISTINCT FROM t.id OR l.owner IS DISTINCT FROM t.worker_id)
             UNION ALL
             SELECT format('lease on %s for turn %s by %s (token %s) but the turn is %s',
                           l.session_id, l.turn_id, l.owner, l.fencing_token,
                           coalesce((SELECT t.state::text FROM turns t WHERE t.id = l.turn_id), 'missing'))
               FROM session_locks l
              WHERE l.turn_id IS NOT NULL
                AND NOT EXISTS (SELECT 1 FROM turns t WHERE t.id = l.turn_id AND t.state = 'running')
             UNION ALL
             SELECT format('free session %s points at head %s but its oldest queued turn is %s',
                           l.session_id, l.head_turn_id, q.id)
               FROM session_locks l
               LEFT JOIN LATERAL (SELECT min(t.id) AS id FROM turns t
                                   WHERE t.session_id = l.session_id AND t.state = 'queued') q ON true
              WHERE l.turn_id IS NULL AND l.head_turn_id IS DISTINCT FROM q.id",
        )
        .fetch_all(pool)
        .await
        .unwrap();
        for row in rows {
            if self.violations.len() < 50 {
                eprintln!(
                    "{}: invariant: {row}",
                    chrono::Utc::now().format("%H:%M:%S%.3f")
                );
                self.violations.push(row);
            }
        }
    }
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

/// Aimed kills. Workers run with a stop point (`KVMEM_TEST_STOP_AT`) and stop themselves
/// there: `mid_write` with half the snapshot bytes in its `.tmp` file, `after_save` with the
/// snapshot renamed into place and the completion not yet committed. A stopped worker is
/// SIGKILLed at exactly that step, then restarted aimed at whichever kind is still short of
/// `required` kills, or not aimed once both are done.
async fn aim(pool: &PgPool, fleet: &mut Fleet, dir: &Path, required: usize, stats: &mut Stats) {
    for slot in 0..fleet.len() {
        let Some((pid, point)) = fleet.stopped(slot) else {
            continue;
        };
        let tmp_before = tmp_files(dir).iter().any(|(_, p)| *p == pid);
        fleet.kill(slot);
        let running = stats.record_kill(pool, pid).await;
        match point {
            "mid_write" => {
                stats.snipes += 1;
                // The partial file is still there: the writer died mid-write.
                if tmp_before && tmp_files(dir).iter().any(|(_, p)| *p == pid) {
                    stats.snipes_mid_write += 1;
                }
            }
            _ => {
                stats.post_save += 1;
                if !running.is_empty() {
                    stats.post_save_before_commit += 1;
                    stats.post_save_turns.extend(running);
                }
            }
        }
        fleet.aims[slot] = if stats.snipes_mid_write < required {
            Some("mid_write")
        } else if stats.post_save_before_commit < required {
            Some("after_save")
        } else {
            None
        };
        fleet.start(slot);
    }
}

/// Kills workers until the plan's kills are done and everything is enqueued, restarting
/// each victim at once.
async fn chaos(
    pool: &PgPool,
    fleet: &mut Fleet,
    rng: &mut StdRng,
    plan: &Plan,
    enqueuer: &tokio::task::JoinHandle<()>,
    stats: &mut Stats,
) {
    let started = Instant::now();
    let gap = |rng: &mut StdRng| {
        Duration::from_millis(rng.gen_range(plan.kill_gap_ms.0..=plan.kill_gap_ms.1))
    };
    let mut next_kill = Instant::now() + gap(rng);
    let mut next_sample = Instant::now();
    let mut next_report = Instant::now() + Duration::from_secs(5);
    let tick = Duration::from_millis(5);
    let aims_done = |stats: &Stats| {
        plan.snipe.as_ref().is_none_or(|(_, required)| {
            stats.snipes_mid_write >= *required && stats.post_save_before_commit >= *required
        })
    };
    while stats.timer_kills < plan.kills || !enqueuer.is_finished() || !aims_done(stats) {
        assert!(
            started.elapsed() < plan.drain_timeout,
            "{}: aimed kills not done in {:?}: mid-write {}/{} after-save {}/{}",
            plan.name,
            plan.drain_timeout,
            stats.snipes_mid_write,
            stats.snipes,
            stats.post_save_before_commit,
            stats.post_save
        );
        tokio::time::sleep(tick).await;
        stats.restart_crashed(fleet);
        if let Some((dir, required)) = &plan.snipe {
            aim(pool, fleet, dir, *required, stats).await;
        }
        if stats.timer_kills < plan.kills && Instant::now() >= next_kill {
            let slot = rng.gen_range(0..fleet.len());
            // A worker stopped at its stop point is the aimed kill's, not the timer's.
            if fleet.stopped(slot).is_some() {
                continue;
            }
            if let Some(pid) = fleet.kill(slot) {
                stats.timer_kills += 1;
                stats.record_kill(pool, pid).await;
            }
            fleet.start(slot);
            next_kill = Instant::now() + gap(rng);
        }
        if Instant::now() >= next_sample {
            stats.sample(pool).await;
            next_sample = Instant::now() + Duration::from_millis(250);
        }
        if Instant::now() >= next_report {
            let (done, pending, running) = progress(pool).await;
            println!(
                "{}: {:>5.1}s killing: kills={} busy={} done={done} pending={pending} running={running}",
                plan.name,
                started.elapsed().as_secs_f64(),
                stats.kills,
                stats.kills_busy,
            );
            next_report = Instant::now() + Duration::from_secs(5);
        }
    }
}

/// Waits until no turn is queued or running, keeping the fleet up and the sampler on.
async fn drain(pool: &PgPool, fleet: &mut Fleet, plan: &Plan, stats: &mut Stats) {
    let started = Instant::now();
    let mut next_report = Instant::now() + Duration::from_secs(5);
    loop {
        stats.restart_crashed(fleet);
        if let Some((dir, required)) = &plan.snipe {
            aim(pool, fleet, dir, *required, stats).await;
        }
        stats.sample(pool).await;
        let (done, pending, running) = progress(pool).await;
        if pending == 0 {
            return;
        }
        if started.elapsed() > plan.drain_timeout {
            let stuck: Vec<String> = sqlx::query_scalar(
                "SELECT format('turn %s %s state=%s attempts=%s run_at=%s worker=%s error=%s | lease turn=%s owner=%s token=%s expires=%s head=%s head_run_at=%s | now=%s',
                               t.id, t.session_id, t.state, t.attempts, t.run_at, t.worker_id, t.error,
                               l.turn_id, l.owner, l.fencing_token, l.expires_at, l.head_turn_id, l.head_run_at, now())
                   FROM turns t LEFT JOIN session_locks l USING (session_id)
                  WHERE t.state IN ('queued', 'running') ORDER BY t.id LIMIT 40",
            )
            .fetch_all(pool)
            .await
            .unwrap();
            panic!(
                "{}: {pending} turns still pending ({running} running, {done} done) {:?} after the killing stopped:\n{}\nworker logs: {}",
                plan.name,
                plan.drain_timeout,
                stuck.join("\n"),
                fleet.log_dir.display()
            );
        }
        if Instant::now() >= next_report {
            println!(
                "{}: {:>5.1}s draining: done={done} pending={pending} running={running}",
                plan.name,
                started.elapsed().as_secs_f64()
            );
            next_report = Instant::now() + Duration::from_secs(5);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

// ---------------------------------------------------------------------------------------
// Verification

#[derive(sqlx::FromRow)]
struct TurnRow {
    id: i64,
    session_id: String,
    state: String,
    attempts: i32,
    message: String,
    reply: Option<String>,
    error: Option<String>,
    echo_ok: bool,
    users: i64,
    assistants: i64,
    users_ok: i64,
    assistants_ok: i64,
    ok_logs: i64,
    ok_attempt: Option<i32>,
}

/// An OK `turn_log` row: session, turn, started, finished, worker.
type LogSpan = (String, i64, DateTime<Utc>, DateTime<Utc>, String);

#[derive(Default)]
struct Verdict {
    turns: usize,
    not_done: Vec<String>,
    duplicates: Vec<String>,
    missing: Vec<String>,
    wrong_content: Vec<String>,
    order_violations: Vec<String>,
    overlaps: Vec<String>,
    retried: usize,
    max_attempts: i32,
    failed_logs: i64,
}

impl Verdict {
    fn problems(&self) -> Vec<(&'static str, &Vec<String>)> {
        [
            ("not done", &self.not_done),
            ("duplicates", &self.duplicates),
            ("missing", &self.missing),
            ("wrong content", &self.wrong_content),
            ("order violations", &self.order_violations),
            ("overlaps", &self.overlaps),
        ]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .collect()
    }
}

fn push(list: &mut Vec<String>, item: String) {
    if list.len() < 1000 {
        list.push(item);
    }
}

/// Reads the whole outcome back. `expected` is each session's messages in enqueue order.
async fn verify(pool: &PgPool, expected: &BTreeMap<String, Vec<String>>, echo: bool) -> Verdict {
    let mut v = Verdict::default();
    let rows: Vec<TurnRow> = sqlx::query_as(
        "SELECT t.id, t.session_id, t.state::text AS state, t.attempts, t.message, t.reply, t.error,
                t.reply IS NOT DISTINCT FROM ('echo: ' || t.message) AS echo_ok,
                (SELECT count(*) FROM messages m WHERE m.turn_id = t.id AND m.role = 'user') AS users,
                (SELECT count(*) FROM messages m WHERE m.turn_id = t.id AND m.role = 'assistant') AS assistants,
                (SELECT count(*) FROM messages m WHERE m.turn_id = t.id AND m.role = 'user'
                    AND m.session_id = t.session_id AND m.content = t.message) AS users_ok,
                (SELECT count(*) FROM messages m WHERE m.turn_id = t.id AND m.role = 'assistant'
                    AND m.session_id = t.session_id AND m.content = t.reply) AS assistants_ok,
                (SELECT count(*) FROM turn_log l WHERE l.turn_id = t.id AND l.status = 'OK') AS ok_logs,
                (SELECT max(l.attempt) FROM turn_log l WHERE l.turn_id = t.id AND l.status = 'OK') AS ok_attempt
           FROM turns t ORDER BY t.id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    v.turns = rows.len();

    // Every enqueued message is there, once, in enqueue order.
    let mut by_session: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for r in &rows {
        by_session
            .entry(r.session_id.as_str())
            .or_default()
            .push(r.message.as_str());
    }
    for (sid, msgs) in expected {
        let got = by_session.remove(sid.as_str()).unwrap_or_default();
        if got != *msgs {
            push(
                &mut v.missing,
                format!("session {sid}: turns by id hold {got:?}, enqueued {msgs:?}"),
            );
        }
    }
    for sid in by_session.keys() {
        push(&mut v.missing, format!("unexpected session {sid}"));
    }

    for r in &rows {
        let who = format!("turn {} ({})", r.id, r.session_id);
        if r.state != "done" {
            push(
                &mut v.not_done,
                format!(
                    "{who}: {} after {} attempts, error {:?}",
                    r.state, r.attempts, r.error
                ),
            );
        }
        // Two messages rows per turn are ruled out by UNIQUE (turn_id, role); what can go
        // wrong is a second successful attempt: a second OK log row (checked here) or one
        // whose attempt is not the last (below).
        if r.ok_logs > 1 {
            push(
                &mut v.duplicates,
                format!("{who}: {} OK turn_log rows", r.ok_logs),
            );
        }
        if r.reply.is_none() || r.users == 0 || r.assistants == 0 || r.ok_logs == 0 {
            push(
                &mut v.missing,
                format!(
                    "{who}: reply {:?}, {} user rows, {} assistant rows, {} OK turn_log rows",
                    r.reply, r.users, r.assistants, r.ok_logs
                ),
            );
        }
        if r.users_ok != r.users || r.assistants_ok != r.assistants || (echo && !r.echo_ok) {
            push(
                &mut v.wrong_content,
                format!("{who}: message {:?}, reply {:?}", r.message, r.reply),
            );
        }
        if r.ok_attempt.is_some_and(|a| a != r.attempts) {
            push(
                &mut v.duplicates,
                format!(
                    "{who}: the OK attempt is {:?} but the turn counts {} attempts (claimed again after success?)",
                    r.ok_attempt, r.attempts
                ),
            );
        }
        if r.attempts > 1 {
            v.retried += 1;
        }
        v.max_attempts = v.max_attempts.max(r.attempts);
    }
    let messages: i64 = sqlx::query_scalar("SELECT count(*) FROM messages")
        .fetch_one(pool)
        .await
        .unwrap();
    if messages != 2 * rows.len() as i64 {
        push(
            &mut v.duplicates,
            format!("messages holds {messages} rows for {} turns", rows.len()),
        );
    }
    v.failed_logs = sqlx::query_scalar("SELECT count(*) FROM turn_log WHERE status <> 'OK'")
        .fetch_one(pool)
        .await
        .unwrap();

    // Order and overlap on successful attempts: the turn_log rows ...
    let logs: Vec<LogSpan> = sqlx::query_as(
        "SELECT sid, turn_id, started_at, finished_at, worker_id FROM turn_log
          WHERE status = 'OK' ORDER BY sid, started_at, id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    for pair in logs.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if a.0 != b.0 {
            continue;
        }
        if b.1 <= a.1 {
            push(
                &mut v.order_violations,
                format!(
                    "session {}: turn {} started {} (by {}) after turn {} started {} (by {})",
                    a.0, b.1, b.2, b.4, a.1, a.2, a.4
                ),
            );
        }
        if b.2 < a.3 {
            push(
                &mut v.overlaps,
                format!(
                    "session {}: turn {} (by {}) ran {}..{}, turn {} (by {}) started {}",
                    a.0, a.1, a.4, a.2, a.3, b.1, b.4, b.2
                ),
            );
        }
    }
    // ... and the dialogue in commit order.
    let dialogue: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT session_id, turn_id, id FROM messages WHERE role = 'assistant' ORDER BY session_id, id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    for pair in dialogue.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if a.0 == b.0 && b.1 <= a.1 {
            push(
                &mut v.order_violations,
                format!(
                    "session {}: reply to turn {} (message {}) committed after turn {} (message {})",
                    a.0, b.1, b.2, a.1, a.2
                ),
            );
        }
    }
    v
}

fn assert_clean(name: &str, v: &Verdict, stats: &Stats, stop_complaints: &[String]) {
    let mut report = String::new();
    for (what, items) in v.problems() {
        report.push_str(&format!("\n{what} ({}):\n", items.len()));
        for item in items.iter().take(20) {
            report.push_str(&format!("  {item}\n"));
        }
    }
    if !stats.violations.is_empty() {
        report.push_str(&format!(
            "\nqueue invariant violations seen by the sampler ({}):\n",
            stats.violations.len()
        ));
        for item in stats.violations.iter().take(20) {
            report.push_str(&format!("  {item}\n"));
        }
    }
    for item in stats.crashes.iter().chain(stop_complaints) {
        report.push_str(&format!("\n{item}\n"));
    }
    assert!(report.is_empty(), "{name}: the promise broke:{report}");
}

fn summary(name: &str, seed: u64, stats: &Stats, v: &Verdict, started: Instant) -> String {
    format!(
        "{name}: seed={seed} kills={} (timed={} mid-snapshot-write={}/{} after-save-before-commit={}/{}) kills_with_running_turn={} \
         turns_stranded={} turns_checked={} retried={} max_attempts={} failed_attempt_logs={} \
         duplicates={} lost={} order_violations={} overlaps={} invariant_violations={} crashes={} \
         sigterm_while_starting={} samples={} elapsed={:.1}s",
        stats.kills,
        stats.timer_kills,
        stats.snipes_mid_write,
        stats.snipes,
        stats.post_save_before_commit,
        stats.post_save,
        stats.kills_busy,
        stats.stranded,
        v.turns,
        v.retried,
        v.max_attempts,
        v.failed_logs,
        v.duplicates.len(),
        v.missing.len() + v.not_done.len(),
        v.order_violations.len(),
        v.overlaps.len(),
        stats.violations.len(),
        stats.crashes.len(),
        stats.sigterm_while_starting,
        stats.samples,
        started.elapsed().as_secs_f64()
    )
}

/// Successful attempts by how they started: warm, or cold with the reason (numbers elided).
async fn starts(pool: &PgPool, turns: Option<&[i64]>) -> BTreeMap<String, i64> {
    sqlx::query_as::<_, (String, i64)>(
        "SELECT CASE WHEN loaded THEN 'warm'
                     ELSE 'cold: ' || split_part(regexp_replace(coalesce(cold_reason, '?'), '[0-9]+', 'N', 'g'), ',', 1)
                END, count(*)
           FROM turn_log WHERE status = 'OK' AND ($1::bigint[] IS NULL OR turn_id = ANY($1))
          GROUP BY 1",
    )
    .bind(turns)
    .fetch_all(pool)
    .await
    .unwrap()
    .into_iter()
    .collect()
}

async fn prepare(pool: &PgPool, users: usize) -> Vec<(String, i64)> {
    migrate(pool).await;
    sqlx::query("UPDATE kvmem_config SET value = '100' WHERE key = 'max_attempts'")
        .execute(pool)
        .await
        .unwrap();
    let mut owners = Vec::new();
    for u in 0..users {
        let user = format!("u{u}");
        let ch = character(pool, &user, &format!("Pilot {u}")).await;
        owners.push((user, ch));
    }
    owners
}

// ---------------------------------------------------------------------------------------
// The tests

#[sqlx::test(migrations = false)]
async fn chaos_echo(pool: PgPool) {
    let _serial = SERIAL.lock().await;
    let long = long_run();
    let plan = Plan {
        name: "chaos_echo",
        sessions: if long { 160 } else { 80 },
        trickle: if long { 40 } else { 10 },
        turns: if long { 50 } else { 20 },
        kills: if long { 200 } else { 30 },
        kill_gap_ms: (80, 400),
        snipe: None,
        drain_timeout: Duration::from_secs(if long { 900 } else { 180 }),
    };
    let workers = if long { 6 } else { 4 };
    let generator = Gen::Echo {
        delay_ms: 5,
        concurrency: 4,
    };
    let seed = seed(0xC4A0_5EED);
    let mut rng = StdRng::seed_from_u64(seed);
    let started = Instant::now();

    let owners = prepare(&pool, 1).await;
    enqueue_backlog(&pool, &plan, &owners).await;
    let url = db_url(&pool).await;
    let logs = log_dir(plan.name);
    let mut fleet = Fleet::new(&url, generator, &logs, workers);
    let trickle = spawn_trickle(&pool, &plan, &owners, seed ^ 1);
    let mut stats = Stats::default();

    chaos(&pool, &mut fleet, &mut rng, &plan, &trickle, &mut stats).await;
    trickle.await.expect("trickle enqueuer");
    drain(&pool, &mut fleet, &plan, &mut stats).await;
    let complaints = fleet.stop(Duration::from_secs(30), &mut stats).await;

    let verdict = verify(&pool, &plan.expected(), true).await;
    println!("{}", summary(plan.name, seed, &stats, &verdict, started));
    assert_eq!(verdict.turns, plan.all_sessions().len() * plan.turns);
    // The kills must have hit work in flight, and stranded turns must have been re-run:
    // otherwise this run proved nothing about recovery.
    // (About a third did in the runs seen; many kills land on a worker still starting up.)
    assert!(
        stats.kills_busy * 6 >= stats.kills,
        "only {} of {} kills hit a running turn",
        stats.kills_busy,
        stats.kills
    );
    assert!(verdict.retried > 0, "no turn needed a second attempt");
    assert_clean(plan.name, &verdict, &stats, &complaints);
}

#[sqlx::test(migrations = false)]
async fn chaos_llama(pool: PgPool) {
    let _serial = SERIAL.lock().await;
    let long = long_run();
    let kv = tempfile::tempdir().unwrap();
    let plan = Plan {
        name: "chaos_llama",
        sessions: if long { 24 } else { 7 },
        trickle: if long { 6 } else { 3 },
        turns: if long { 20 } else { 6 },
        kills: if long { 40 } else { 6 },
        kill_gap_ms: (300, 1500),
        snipe: Some((kv.path().to_path_buf(), if long { 15 } else { 3 })),
        drain_timeout: Duration::from_secs(if long { 1200 } else { 240 }),
    };
    let workers = if long { 3 } else { 2 };
    let generator = Gen::Llama {
        kv_dir: kv.path().to_path_buf(),
    };
    let seed = seed(0x11A_3A5EED);
    let mut rng = StdRng::seed_from_u64(seed);
    let started = Instant::now();

    let owners = prepare(&pool, 2).await;
    enqueue_backlog(&pool, &plan, &owners).await;
    let url = db_url(&pool).await;
    let logs = log_dir(plan.name);
    // Slot 0 stops itself mid snapshot write, slot 1 after the save and before the commit;
    // the rest (long run) are only killed by the timer.
    let mut aims = vec![None; workers];
    aims[0] = Some("mid_write");
    aims[1] = Some("after_save");
    let mut fleet = Fleet::aimed(&url, generator.clone(), &logs, aims);
    let trickle = spawn_trickle(&pool, &plan, &owners, seed ^ 1);
    let mut stats = Stats::default();

    chaos(&pool, &mut fleet, &mut rng, &plan, &trickle, &mut stats).await;
    trickle.await.expect("trickle enqueuer");
    drain(&pool, &mut fleet, &plan, &mut stats).await;
    let mut complaints = fleet.stop(Duration::from_secs(30), &mut stats).await;
    drop(fleet);

    // After the storm: one more turn per session on a fresh worker, warm or cold, must succeed.
    let mut fresh = Fleet::new(&url, generator, &logs, 1);
    let mut last_turn = HashMap::new();
    for s in plan.all_sessions() {
        let id = enqueue(&pool, &owners, s, plan.turns).await;
        let (user, ch) = &owners[s % owners.len()];
        last_turn.insert(kvmem::snapshot::scope_key(user, *ch, &session_id(s)), id);
    }
    drain(&pool, &mut fresh, &plan, &mut stats).await;
    complaints.extend(fresh.stop(Duration::from_secs(30), &mut stats).await);
    drop(fresh);
    let final_ids: Vec<i64> = last_turn.values().copied().collect();
    let final_ok: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM turn_log WHERE status = 'OK' AND turn_id = ANY($1)",
    )
    .bind(&final_ids)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        final_ok,
        final_ids.len() as i64,
        "final turns without an OK log row"
    );
    let final_starts = starts(&pool, Some(&final_ids)).await;
    let chaos_starts = starts(&pool, None).await;

    // Snapshots: every .llkv decodes and holds its session's last turn; a partial write is
    // never a .llkv (stale .tmp files of killed processes and quarantined .bad files are fine).
    let (mut llkv, mut bad, mut tmp) = (0, 0, 0);
    let mut snapshot_problems = Vec::new();
    for entry in std::fs::read_dir(kv.path()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if let Some(scope) = name.strip_suffix(".llkv") {
            llkv += 1;
            let bytes = std::fs::read(&path).unwrap();
            match kvmem::snapshot::decode(&bytes, kvmem::snapshot::Limits::LOOSE) {
                Err(e) => snapshot_problems.push(format!("{name}: does not decode: {e}")),
                Ok(snap) if snap.header.scope != scope => {
                    snapshot_problems.push(format!("{name}: header scope is {}", snap.header.scope))
                }
                Ok(snap) if last_turn.get(scope) != Some(&snap.header.turn_id) => snapshot_problems
                    .push(format!(
                        "{name}: holds turn {}, the session's last turn is {:?}",
                        snap.header.turn_id,
                        last_turn.get(scope)
                    )),
                Ok(_) => {}
            }
        } else if name.ends_with(".bad") {
            bad += 1;
        } else if name.starts_with('.') && name.ends_with(".tmp") {
            tmp += 1;
        } else {
            snapshot_problems.push(format!("{name}: unexpected file in the KV directory"));
        }
    }
    for scope in last_turn.keys() {
        if !kv.path().join(format!("{scope}.llkv")).exists() {
            snapshot_problems.push(format!(
                "{scope}.llkv is missing after its session's last turn"
            ));
        }
    }

    let mut expected = plan.expected();
    for (s, msgs) in plan.all_sessions().zip(expected.values_mut()) {
        msgs.push(message(s, plan.turns));
    }
    let verdict = verify(&pool, &expected, false).await;
    println!("{}", summary(plan.name, seed, &stats, &verdict, started));
    println!(
        "{}: all turns: {chaos_starts:?}; after the storm: {final_starts:?}; snapshots: {llkv} llkv, {bad} quarantined, {tmp} stale tmp",
        plan.name
    );
    assert_eq!(verdict.turns, plan.all_sessions().len() * (plan.turns + 1));
    // The aimed kills happened, each at its step, as many as the plan requires ...
    let required = plan.snipe.as_ref().map_or(0, |(_, n)| *n);
    assert!(
        stats.snipes_mid_write >= required,
        "kills mid snapshot write: {} (of {} aimed), need {required}",
        stats.snipes_mid_write,
        stats.snipes
    );
    assert!(
        stats.post_save_before_commit >= required,
        "kills between save and commit: {} (of {} aimed), need {required}",
        stats.post_save_before_commit,
        stats.post_save
    );
    // ... and every turn killed between its save and its commit found that snapshot stale
    // when it ran again: it never resumed the KV of an attempt that did not commit.
    let stale_turns: Vec<i64> = sqlx::query_scalar(
        "SELECT DISTINCT turn_id FROM turn_log WHERE turn_id = ANY($1) AND cold_reason LIKE 'stale%'",
    )
    .bind(&stats.post_save_turns)
    .fetch_all(&pool)
    .await
    .unwrap();
    let mut missing_stale: Vec<i64> = stats.post_save_turns.clone();
    missing_stale.retain(|t| !stale_turns.contains(t));
    assert!(
        missing_stale.is_empty(),
        "turns killed after their save that never started stale: {missing_stale:?}"
    );
    assert!(
        snapshot_problems.is_empty(),
        "snapshots:\n{}",
        snapshot_problems.join("\n")
    );
    assert_clean(plan.name, &verdict, &stats, &complaints);
}
