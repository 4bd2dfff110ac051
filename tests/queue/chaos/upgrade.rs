//! A fleet's rolling upgrade under load, without a second build: two `kvmem worker`
//! processes (the echo generator: queue mechanics only) answer a few sessions' turns while
//! a newer release's additive migration (a fixture the binary does not know, recorded as
//! sqlx records a release's file) is applied beneath them; they keep working; then each is
//! stopped with SIGTERM and started again, one by one, as an upgrade replaces a fleet's
//! binaries, and starts on the newer schema. Counted as the chaos runs count: 0 lost,
//! 0 duplicated, 0 out of order.

use super::harness::drain;
use super::harness::*;
use super::*;
use crate::upgrades::{apply_fixture, ADDITIVE_FIXTURE};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const SESSIONS: usize = 4;

/// Enqueues a round (one turn per session) every `gap` until `stop`; returns the rounds.
fn spawn_enqueuer(
    pool: &PgPool,
    owners: &[(String, i64)],
    gap: Duration,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<usize> {
    let (pool, owners) = (pool.clone(), owners.to_vec());
    tokio::spawn(async move {
        let start = tokio::time::Instant::now();
        let mut rounds = 0;
        while !stop.load(Ordering::SeqCst) {
            for s in 0..SESSIONS {
                enqueue(&pool, &owners, s, rounds).await;
            }
            rounds += 1;
            // On a schedule (load, not synchronisation): slow enqueues do not add up.
            tokio::time::sleep_until(start + gap * rounds as u32).await;
        }
        rounds
    })
}

/// Waits until `count` says at least `want`, keeping an eye on the fleet: a worker that
/// exits by itself fails the test at once.
async fn wait_for(
    fleet: &mut Fleet,
    what: &str,
    want: i64,
    mut count: impl AsyncFnMut() -> i64,
) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let exited = fleet.exited_by_themselves();
        assert!(exited.is_empty(), "{what}: {exited:?}");
        let got = count().await;
        if got >= want {
            return got;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {got} of {want} after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn done(pool: &PgPool) -> i64 {
    progress(pool).await.0
}

/// Turns the process with this pid completed.
async fn completed_by(pool: &PgPool, pid: u32) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM turn_log WHERE status = 'OK' AND worker_id LIKE $1")
        .bind(format!("%:{pid}:%"))
        .fetch_one(pool)
        .await
        .unwrap()
}

/// SIGTERM to one slot's worker; it must exit 0 (finishing or releasing its turns).
async fn stop_one(fleet: &mut Fleet, slot: usize) {
    let mut child = fleet.slots[slot].take().expect("a running worker");
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "slot {slot} ignored SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        status.success(),
        "slot {slot} ended with {status}:\n{}",
        tail(&fleet.logs[slot], 15)
    );
}

#[sqlx::test(migrations = false)]
async fn rolling_upgrade_under_load(pool: PgPool) {
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let owners = prepare(&pool, 2).await;
    let url = db_url(&pool).await;
    let logs = log_dir("rolling_upgrade");
    let generator = Gen::Echo {
        delay_ms: 5,
        concurrency: 2,
    };
    let mut fleet = Fleet::new(&url, generator, &logs, 2);
    let stop = Arc::new(AtomicBool::new(false));
    let enqueuer = spawn_enqueuer(&pool, &owners, Duration::from_millis(40), stop.clone());

    // Both workers answer turns on the schema they know.
    wait_for(
        &mut fleet,
        "before the migration",
        2 * SESSIONS as i64,
        || done(&pool),
    )
    .await;
    apply_fixture(&pool, ADDITIVE_FIXTURE).await;
    let at_migration = done(&pool).await;
    // They keep answering on a schema newer than theirs.
    wait_for(
        &mut fleet,
        "after the migration",
        at_migration + 4 * SESSIONS as i64,
        || done(&pool),
    )
    .await;
    // One by one: stop, start again on the newer schema, and see it answer turns.
    for slot in 0..fleet.len() {
        stop_one(&mut fleet, slot).await;
        fleet.start(slot);
        let pid = fleet.slots[slot].as_ref().unwrap().id();
        wait_for(&mut fleet, &format!("restarted slot {slot}"), 3, || {
            completed_by(&pool, pid)
        })
        .await;
    }
    stop.store(true, Ordering::SeqCst);
    let rounds = enqueuer.await.expect("enqueuer");
    let plan = Plan {
        name: "rolling_upgrade",
        sessions: SESSIONS,
        trickle: 0,
        turns: rounds,
        kills: 0,
        kill_gap_ms: (0, 0),
        snipe: None,
        drain_timeout: Duration::from_secs(60),
    };
    let mut stats = Stats::default();
    drain(&pool, &mut fleet, &plan, &mut stats).await;
    let restarted_logs = [fleet.logs[0].clone(), fleet.logs[1].clone()];
    let complaints = fleet.stop(Duration::from_secs(30), &mut stats).await;

    let verdict = verify(&pool, &plan.expected(), true).await;
    println!("{}", summary(plan.name, 0, &stats, &verdict, started));
    assert_eq!(verdict.turns, SESSIONS * rounds);
    // Each restarted worker saw the newer schema and ran on it, leaving its SQL API be.
    let newer_seen = restarted_logs
        .iter()
        .filter(|log| {
            std::fs::read_to_string(log)
                .unwrap()
                .contains("the database schema is newer than this binary")
        })
        .count();
    assert_eq!(
        newer_seen, 2,
        "restarted workers that logged the newer schema"
    );
    let fixture: bool =
        sqlx::query_scalar("SELECT success FROM _sqlx_migrations WHERE version = 29991231000001")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(fixture);
    assert_clean(plan.name, &verdict, &stats, &complaints);
}
