//! Postgres restarts and crashes under load, with turns in flight: workers reconnect with
//! backoff, LISTEN comes back, the dirty-marker rescan runs, and no turn or digest rebuild
//! is lost or doubled. Two outages: a clean restart (`pg_ctl restart -m fast`) and a crash
//! (`pg_ctl stop -m immediate`, no checkpoint, then crash recovery on start). Each test uses
//! a cluster of its own (ops/pg), because restarting the shared test cluster would break
//! the other suites running beside it.

use crate::common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{assert_success, kvmem_command, tiny_model};
use sqlx::PgPool;

const PG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/ops/pg");

struct Cluster {
    dir: String,
    port: String,
    url: String,
}

impl Cluster {
    /// Where cluster `n` of this test process lives and listens on its `attempt`th try.
    /// The ports sit below Linux's ephemeral range (32768 and up), where a client
    /// connection's local port could already hold them.
    fn place(n: u32, attempt: u32) -> (String, String) {
        let pid = std::process::id();
        let dir = format!("/tmp/kvmem-pg-restart-{pid}-{n}-{attempt}");
        let port = (20000 + ((pid % 1000) * 9 + n + attempt * 3) % 12000).to_string();
        (dir, port)
    }

    /// Starts cluster `n` (0, 1 or 2). A port another process holds is the machine's, not
    /// the code under test's: the start is tried on three ports, and each failure's log
    /// is printed.
    fn start(n: u32) -> Cluster {
        Cluster::start_tries(n, 3)
    }

    fn start_tries(n: u32, tries: u32) -> Cluster {
        let mut failures = Vec::new();
        for attempt in 0..tries {
            let (dir, port) = Cluster::place(n, attempt);
            let out = Command::new(PG)
                .arg("start")
                .env_remove("DATABASE_URL")
                .env("KVMEM_PG_DIR", &dir)
                .env("KVMEM_PG_PORT", &port)
                .output()
                .expect("ops/pg start");
            if !out.status.success() {
                let why = String::from_utf8_lossy(&out.stderr).to_string();
                eprintln!("ops/pg start on port {port} failed:\n{why}");
                failures.push(why);
                // Deletes the data directory, whose config names the failed port.
                drop(Cluster {
                    dir,
                    port,
                    url: String::new(),
                });
                continue;
            }
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            let url = text
                .trim()
                .trim_start_matches("export DATABASE_URL='")
                .trim_end_matches('\'')
                .to_string();
            return Cluster { dir, port, url };
        }
        panic!("ops/pg start failed on {tries} port(s): {failures:#?}");
    }

    /// `restart` or `crash` (see ops/pg).
    fn outage(&self, how: &str) {
        let out = Command::new(PG)
            .arg(how)
            .env("KVMEM_PG_DIR", &self.dir)
            .env("KVMEM_PG_PORT", &self.port)
            .output()
            .unwrap();
        assert_success(&out);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(PG)
            .arg("stop")
            .env("KVMEM_PG_DIR", &self.dir)
            .env("KVMEM_PG_PORT", &self.port)
            .output();
    }
}

struct Workers(Vec<Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for w in &mut self.0 {
            let _ = w.kill();
            let _ = w.wait();
        }
    }
}

/// Where worker `n` of this test process writes its log, so a worker that exits can say why.
fn worker_log(n: usize) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("kvmem-pg-restart-{}-{n}.log", std::process::id()))
}

fn worker(url: &str) -> Child {
    worker_logged(url).0
}

/// An echo worker on `url`, and the file its log goes to.
fn worker_logged(url: &str) -> (Child, std::path::PathBuf) {
    static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let log = std::fs::File::create(worker_log(n)).unwrap();
    let child = kvmem_command(url)
        .args([
            "worker",
            "--generator",
            "echo",
            "--concurrency",
            "2",
            // Long enough that turns are surely in flight when the database goes away.
            "--echo-delay-ms",
            "100",
        ])
        .env("KVMEM_MODEL_PATH", tiny_model())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    (child, worker_log(n))
}

/// Retries through the outage: the backend's view of a restart.
async fn until_ok<T, F, Fut>(mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) => {
                assert!(Instant::now() < deadline, "gave up: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn write_fact(pool: &PgPool, sid: &str, step: usize) {
    until_ok(|| async {
        sqlx::query(
            "INSERT INTO facts (session_id, type, key, value) VALUES ($1, 'quest', 'q', $2)
             ON CONFLICT (session_id, type, key) DO UPDATE SET value = EXCLUDED.value, updated_at = now()",
        )
        .bind(sid)
        .bind(format!("Quest step {step}"))
        .execute(pool)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_survive_a_postgres_restart_and_lose_nothing() {
    outage_under_load(0, "restart").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_survive_a_postgres_crash_and_lose_nothing() {
    outage_under_load(1, "crash").await;
}

async fn outage_under_load(n: u32, how: &str) {
    let cluster = Cluster::start(n);
    let pool = kvmem::system::connect_url(&cluster.url, 4).await.unwrap();
    kvmem::db::migrate(&pool).await.unwrap();
    let ch: i64 = sqlx::query_scalar(
        "INSERT INTO user_characters (user_id, name) VALUES ('u', 'Ada') RETURNING id",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let _workers = Workers(vec![worker(&cluster.url), worker(&cluster.url)]);
    let (sessions, turns) = (20, 10);
    let mut ids = Vec::new();
    let mut in_flight: Vec<i64> = Vec::new();
    for t in 0..turns {
        if t == turns / 2 {
            // Mid-run: facts, then the restart, then more facts written right after it.
            for s in 0..sessions {
                write_fact(&pool, &format!("s{s}"), 1).await;
            }
            // The outage must catch turns mid-flight: wait until some run, and remember them.
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                in_flight = sqlx::query_scalar("SELECT id FROM turns WHERE state = 'running'")
                    .fetch_all(&pool)
                    .await
                    .unwrap();
                if !in_flight.is_empty() {
                    break;
                }
                assert!(Instant::now() < deadline, "no turn ever ran");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            cluster.outage(how);
            for s in 0..sessions / 2 {
                write_fact(&pool, &format!("s{s}"), 2).await;
            }
        }
        for s in 0..sessions {
            let sid = format!("s{s}");
            let key = format!("{sid}:{t}");
            let id = until_ok(|| async {
                kvmem::queue::enqueue(&pool, &sid, "u", ch, &format!("turn {t}"), Some(&key))
                    .await
                    .map_err(|e| e.to_string())
            })
            .await;
            ids.push(id.0);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let done: i64 = until_ok(|| async {
            sqlx::query_scalar("SELECT count(*) FROM turns WHERE state = 'done'")
                .fetch_one(&pool)
                .await
                .map_err(|e| e.to_string())
        })
        .await;
        if done as usize == ids.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {done} of {} turns done after the restart",
            ids.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Exactly one successful attempt per turn (a second one would be a duplicate reply),
    // its reply stored, and the turns that were in flight at the outage among them.
    let per_turn: Vec<(i64, i64, bool)> = sqlx::query_as(
        "SELECT t.id,
                (SELECT count(*) FROM turn_log l WHERE l.turn_id = t.id AND l.status = 'OK'),
                EXISTS (SELECT 1 FROM messages m WHERE m.turn_id = t.id AND m.role = 'assistant'
                           AND m.content = t.reply AND t.reply = 'echo: ' || t.message)
           FROM turns t",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(per_turn.len(), ids.len());
    let wrong: Vec<_> = per_turn
        .iter()
        .filter(|(_, ok, reply)| *ok != 1 || !reply)
        .collect();
    assert!(
        wrong.is_empty(),
        "turns without exactly one OK attempt and its reply: {wrong:?}"
    );
    assert!(!in_flight.is_empty());
    assert!(in_flight.iter().all(|id| ids.contains(id)));
    // Every digest caught up, including facts written right after the restart.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut stale = Vec::new();
        for s in 0..sessions {
            let sid = format!("s{s}");
            // The last write wins: step 2 for the first half of the sessions, else step 1.
            let want = format!("Quest: Quest step {}", if s < sessions / 2 { 2 } else { 1 });
            let have: Option<String> =
                sqlx::query_scalar("SELECT digest_content FROM state_digest WHERE session_id = $1")
                    .bind(&sid)
                    .fetch_optional(&pool)
                    .await
                    .unwrap();
            if have.as_deref() != Some(want.as_str()) {
                stale.push(sid);
            }
        }
        if stale.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "digests never rebuilt for {stale:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let dirty: i64 = sqlx::query_scalar("SELECT count(*) FROM digest_dirty")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(dirty, 0);
    // The workers are still up.
    let mut workers = _workers;
    for w in &mut workers.0 {
        if let Some(status) = w.try_wait().unwrap() {
            let logs: Vec<String> = (0..4)
                .filter_map(|n| std::fs::read_to_string(worker_log(n)).ok())
                .collect();
            panic!(
                "a worker exited during the restart ({status}); worker logs:\n{}",
                logs.join("\n---\n")
            );
        }
    }
}

/// A worker started while its database is still down waits for it instead of exiting
/// (workers and Postgres are often started together), then works as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_started_before_its_database_waits_for_it() {
    // One port only: the worker is already pointed at it.
    let (dir, port) = Cluster::place(2, 0);
    let out = Command::new(PG)
        .arg("url")
        .env("KVMEM_PG_DIR", &dir)
        .env("KVMEM_PG_PORT", &port)
        .output()
        .unwrap();
    assert_success(&out);
    let url = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let (child, log) = worker_logged(&url);
    let mut early = Workers(vec![child]);
    // The worker must have met the missing database before the database exists.
    let waits = |text: &str| text.matches("database unavailable at start").count();
    let deadline = Instant::now() + Duration::from_secs(60);
    while waits(&std::fs::read_to_string(&log).unwrap_or_default()) == 0 {
        assert!(
            early.0[0].try_wait().unwrap().is_none(),
            "the worker exited without a database: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        assert!(
            Instant::now() < deadline,
            "the worker never tried to connect"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cluster = Cluster::start_tries(2, 1);
    assert_eq!(cluster.url, url);
    let pool = until_ok(|| async {
        kvmem::system::connect_url(&cluster.url, 2)
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    // The worker migrates the database; the test only writes once the schema is there.
    let ch: i64 = until_ok(|| async {
        sqlx::query_scalar(
            "INSERT INTO user_characters (user_id, name) VALUES ('u', 'Ada') RETURNING id",
        )
        .fetch_one(&pool)
        .await
        .map_err(|e| e.to_string())
    })
    .await;
    let id = until_ok(|| async {
        kvmem::queue::enqueue(&pool, "s", "u", ch, "hello", None)
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let state: String = sqlx::query_scalar("SELECT state::text FROM turns WHERE id = $1")
            .bind(id.0)
            .fetch_one(&pool)
            .await
            .unwrap();
        if state == "done" {
            break;
        }
        assert!(
            early.0[0].try_wait().unwrap().is_none(),
            "the worker exited: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        assert!(Instant::now() < deadline, "the turn was not done: {state}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(early.0[0].try_wait().unwrap().is_none(), "{text}");
    drop(early);
}
