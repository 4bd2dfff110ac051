//! HUD and digest: seed 000's runbook scene through the real queue and worker, digest
//! determinism across processes, NOTIFY-driven rebuilds, expiry without writes, and the HUD.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use kvmem::context::digest;
use kvmem::context::hud;
use kvmem::context::tokens::TokenCount;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

#[sqlx::test(migrations = false)]
async fn seed_000_runbook_scene(pool: PgPool) {
    runbook(pool, tiny_model(), tiny_model_alt()).await;
}

#[sqlx::test(migrations = false)]
async fn seed_000_runbook_scene_on_smollm2(pool: PgPool) {
    // The model change goes to the tiny model: another file, another MODEL_SHA.
    runbook(pool, smollm2(), tiny_model()).await;
}

async fn runbook(pool: PgPool, model: std::path::PathBuf, other_model: std::path::PathBuf) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let sid = "session_123";
    fact(
        &pool,
        sid,
        "relationship",
        "tech_syndicate",
        "Allied with Tech Syndicate (+15 standing)",
    )
    .await;
    fact(
        &pool,
        sid,
        "debt",
        "first_bank",
        "Owes 500 credits to First Bank",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let tail = 256;
    let s = settings(serde_json::json!({
        "kv_dir": dir.path(), "n_ctx": 1024, "kv_tail_tokens": tail, "reply_max_tokens": 24,
    }));
    let deps = llama_deps(&pool, s.clone(), load_engine(&model, &s), "w1");
    let mut turn = 0;
    let mut say = async |deps: &kvmem::runner::Deps| {
        turn += 1;
        one_turn(deps, sid, "u1", ch, &format!("T{turn}: report, captain."))
            .await
            .1
    };

    let t1 = say(&deps).await;
    assert!(t1.cold && t1.digest_injected, "T1 {t1:?}");
    assert!(t1.s_tokens > 0);
    // Seed 000's rule, derived here without the digest module: `{Type}: {value}` lines,
    // sorted, joined by newlines, SHA-256 of that text.
    let expected = "Debt: Owes 500 credits to First Bank\n\
                    Relationship: Allied with Tech Syndicate (+15 standing)";
    let want = {
        use sha2::Digest as _;
        hex::encode(sha2::Sha256::digest(expected.as_bytes()))
    };
    assert_eq!(
        t1.digest_version, want,
        "digest_version of the seed's two facts"
    );
    for _ in 2..=3 {
        let t = say(&deps).await;
        assert!(!t.cold && t.loaded && !t.digest_injected, "{t:?}");
        assert_eq!(t.digest_version, t1.digest_version);
    }
    // Seed 000's "Start Conflict".
    sqlx::query(
        "INSERT INTO facts (session_id, type, key, value, status, started_at, updated_at)
         VALUES ('session_123', 'conflict', 'merchant_war', 'War with Merchant Guild over trade routes', 'active', NOW(), NOW())",
    )
    .execute(&pool)
    .await
    .unwrap();
    let t4 = say(&deps).await;
    assert!(!t4.cold && t4.digest_injected, "T4 {t4:?}");
    assert_ne!(t4.digest_version, t1.digest_version);
    let mut most_kv = 0;
    for _ in 5..=10 {
        let t = say(&deps).await;
        assert!(!t.cold && !t.digest_injected, "{t:?}");
        assert!(t.tokens_in_kv <= tail);
        most_kv = most_kv.max(t.tokens_in_kv);
    }
    // A prune takes the KV down to 3/4 of the tail, so it grows back towards the tail.
    assert!(
        most_kv > tail * 3 / 4,
        "tokens_in_kv should approach the tail, got at most {most_kv}"
    );

    // Restart mid-scene: a new worker (new engine, new pipeline) resumes warm.
    drop(deps);
    let deps = llama_deps(&pool, s.clone(), load_engine(&model, &s), "w2");
    let t = say(&deps).await;
    assert!(t.loaded && !t.cold, "after restart {t:?}");

    // Another model file: exactly one cold start with injection, then warm again.
    drop(deps);
    let deps = llama_deps(&pool, s.clone(), load_engine(&other_model, &s), "w3");
    let t = say(&deps).await;
    assert!(t.cold && t.digest_injected, "model change {t:?}");
    let t = say(&deps).await;
    assert!(
        t.loaded && !t.cold && !t.digest_injected,
        "after model change {t:?}"
    );

    // Seed 000's "End Conflict": the next turn injects a digest without it.
    sqlx::query(
        "UPDATE facts SET status = 'resolved', resolved_at = NOW()
          WHERE session_id = 'session_123' AND type = 'conflict' AND key = 'merchant_war'",
    )
    .execute(&pool)
    .await
    .unwrap();
    let t = say(&deps).await;
    assert!(t.digest_injected && !t.cold, "{t:?}");
    assert_eq!(
        t.digest_version, t1.digest_version,
        "same facts as T1, same version"
    );
    let content: String =
        sqlx::query_scalar("SELECT digest_content FROM state_digest WHERE session_id = $1")
            .bind(sid)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(!content.contains("Conflict"), "{content}");
    // Every turn logged the seed's fields.
    let lines: i64 =
        sqlx::query_scalar("SELECT count(*) FROM turn_log WHERE sid = $1 AND path = 'kv_only'")
            .bind(sid)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(lines, 14);
}

#[sqlx::test(migrations = false)]
async fn digest_version_is_the_same_in_any_order_and_in_another_process(pool: PgPool) {
    migrate(&pool).await;
    let url = db_url(&pool).await;
    let tiny = load_engine(&tiny_model(), &settings(serde_json::json!({})));
    let types = [
        "conflict",
        "relationship",
        "debt",
        "quest",
        "buff",
        "rumor",
        "alliance",
        "gossip",
    ];
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for case in 0..12 {
        let n = rng.gen_range(1..8);
        let facts: Vec<(String, String, String)> = (0..n)
            .map(|i| {
                let t = types[rng.gen_range(0..types.len())].to_string();
                let spaces = " ".repeat(rng.gen_range(1..4));
                (
                    t,
                    format!("k{i}"),
                    format!("  value{spaces}{} of case {case} ", rng.gen_range(0..1000)),
                )
            })
            .collect();
        let mut shuffled = facts.clone();
        shuffled.shuffle(&mut rng);
        let (a, b) = (format!("a{case}"), format!("b{case}"));
        for (t, k, v) in &facts {
            fact(&pool, &a, t, k, v).await;
        }
        // Another order, with a pause so timestamps and ids differ.
        tokio::time::sleep(Duration::from_millis(5)).await;
        for (t, k, v) in &shuffled {
            fact(&pool, &b, t, k, v).await;
        }
        let va = digest::build_for(&pool, &a, 180, tiny.as_ref())
            .await
            .unwrap();
        let vb = digest::build_for(&pool, &b, 180, tiny.as_ref())
            .await
            .unwrap();
        assert_eq!(va.version, vb.version, "case {case}");
        assert_eq!(va.content, vb.content);
        assert!(
            !va.content.contains("k0"),
            "keys and ids stay out of the text"
        );
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvmem"))
            .args(["digest", "--session", &b])
            .env("DATABASE_URL", &url)
            .env("KVMEM_MODEL_PATH", tiny_model())
            .env("KVMEM_LOG_LEVEL", "error")
            .output()
            .unwrap();
        assert_success(&out);
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert_eq!(
            stdout.lines().next().unwrap(),
            va.version,
            "case {case}: another process disagrees"
        );
    }
}

/// The digest rebuilder on a 30 s poll (so a rebuild within the tests' waits came from
/// NOTIFY or from an expiry), with the token that stops it.
fn spawn_rebuilder(pool: &PgPool) -> (tokio::task::JoinHandle<()>, CancellationToken) {
    let shutdown = CancellationToken::new();
    let tok: Arc<dyn TokenCount> = Arc::new(kvmem::context::tokens::WordCount);
    let task = tokio::spawn(digest::run_rebuilder(
        pool.clone(),
        tok,
        180,
        Duration::from_secs(30),
        Arc::new(kvmem::metrics::Metrics::new()),
        shutdown.clone(),
    ));
    (task, shutdown)
}

#[sqlx::test(migrations = false)]
async fn fact_writes_trigger_rebuilds_through_notify(pool: PgPool) {
    migrate(&pool).await;
    // A long poll: only NOTIFY can make this fast.
    let (task, shutdown) = spawn_rebuilder(&pool);
    // Write only once the rebuilder's LISTEN has run, so the rebuild below can come from
    // NOTIFY alone (the start-up rescan has passed, the next poll is 30 s away).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let listening: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND state = 'idle'
                AND query ILIKE 'LISTEN%kvmem_facts%'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        if listening > 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the rebuilder never listened"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    fact(&pool, "s", "quest", "relic", "Find the relic").await;
    let v1 = wait_for_digest(&pool, "s", |c| c.contains("Quest: Find the relic")).await;
    sqlx::query("DELETE FROM facts WHERE session_id = 's'")
        .execute(&pool)
        .await
        .unwrap();
    let v2 = wait_for_digest(&pool, "s", |c| c.is_empty()).await;
    assert_ne!(v1, v2);
    let dirty: i64 = sqlx::query_scalar("SELECT count(*) FROM digest_dirty")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(dirty, 0, "markers are cleared after the rebuild");
    shutdown.cancel();
    task.await.unwrap();
}

#[sqlx::test(migrations = false)]
async fn dirty_markers_written_while_no_one_listens_are_rebuilt_on_start(pool: PgPool) {
    migrate(&pool).await;
    fact(&pool, "s", "debt", "bank", "Owes 5").await;
    let (task, shutdown) = spawn_rebuilder(&pool);
    wait_for_digest(&pool, "s", |c| c == "Debt: Owes 5").await;
    shutdown.cancel();
    task.await.unwrap();
}

#[sqlx::test(migrations = false)]
async fn an_expiring_buff_leaves_the_digest_without_any_write(pool: PgPool) {
    migrate(&pool).await;
    fact(&pool, "s", "debt", "bank", "Owes 5").await;
    sqlx::query(
        "INSERT INTO facts (session_id, type, key, value, expires_at) VALUES ('s', 'buff', 'shield', 'Shielded', now() + interval '2 seconds')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let (task, shutdown) = spawn_rebuilder(&pool);
    wait_for_digest(&pool, "s", |c| c.contains("Buff: Shielded")).await;
    let before: (i64, i64) = sqlx::query_as(
        "SELECT n_tup_ins + n_tup_upd + n_tup_del, 0::bigint FROM pg_stat_xact_user_tables WHERE relname = 'facts'",
    )
    .fetch_optional(&pool)
    .await
    .unwrap()
    .unwrap_or((0, 0));
    let facts_before: Vec<(i64, chrono::DateTime<chrono::Utc>)> =
        sqlx::query_as("SELECT id, updated_at FROM facts ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    // The rebuilder wakes at expires_at, not at the 30 s poll.
    let started = std::time::Instant::now();
    wait_for_digest(&pool, "s", |c| c == "Debt: Owes 5").await;
    assert!(started.elapsed() < Duration::from_secs(10));
    let facts_after: Vec<(i64, chrono::DateTime<chrono::Utc>)> =
        sqlx::query_as("SELECT id, updated_at FROM facts ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(facts_before, facts_after, "no write to facts");
    let _ = before;
    shutdown.cancel();
    task.await.unwrap();
}

/// How many `digest_rebuilt` events the session has.
async fn rebuild_events(pool: &PgPool, sid: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM events WHERE kind = 'digest_rebuilt' AND session_id = $1",
    )
    .bind(sid)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrations = false)]
async fn many_writes_to_one_session_before_its_rebuild_are_one_rebuild(pool: PgPool) {
    migrate(&pool).await;
    let mut listener = sqlx::postgres::PgListener::connect_with(&pool)
        .await
        .unwrap();
    listener.listen(digest::FACTS_CHANNEL).await.unwrap();
    for step in 1..=5 {
        fact(&pool, "s", "quest", "q", &format!("Step {step}")).await;
    }
    let mut rung = Vec::new();
    for _ in 0..5 {
        rung.push(listener.recv().await.unwrap().payload().to_string());
    }
    assert_eq!(rung, vec!["s"; 5], "one notification per write");
    let metrics = kvmem::metrics::Metrics::new();
    let tok = kvmem::context::tokens::WordCount;
    let changed = digest::rebuild_notified(&pool, &rung, 180, &tok, &metrics)
        .await
        .unwrap();
    assert_eq!(changed, 1, "five writes, one rebuild");
    assert_eq!(rebuild_events(&pool, "s").await, 1);
    let content: String =
        sqlx::query_scalar("SELECT digest_content FROM state_digest WHERE session_id = 's'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(content, "Quest: Step 5");
    // The same notifications again (a second rebuilder heard them too): the marker is
    // gone, so nothing is rebuilt.
    let again = digest::rebuild_notified(&pool, &rung, 180, &tok, &metrics)
        .await
        .unwrap();
    assert_eq!(again, 0);
    assert_eq!(rebuild_events(&pool, "s").await, 1);
}

#[sqlx::test(migrations = false)]
async fn a_write_still_in_flight_is_rebuilt_after_its_commit(pool: PgPool) {
    migrate(&pool).await;
    let metrics = kvmem::metrics::Metrics::new();
    let tok = kvmem::context::tokens::WordCount;
    let sessions = vec!["s".to_string()];
    let mut write = pool.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO facts (session_id, type, key, value) VALUES ('s', 'debt', 'bank', 'Owes 5')",
    )
    .execute(&mut *write)
    .await
    .unwrap();
    // Its marker is held by the open transaction: skipped, not waited for.
    let changed = digest::rebuild_notified(&pool, &sessions, 180, &tok, &metrics)
        .await
        .unwrap();
    assert_eq!(changed, 0);
    write.commit().await.unwrap();
    let changed = digest::rebuild_notified(&pool, &sessions, 180, &tok, &metrics)
        .await
        .unwrap();
    assert_eq!(changed, 1);
    let dirty: i64 = sqlx::query_scalar("SELECT count(*) FROM digest_dirty")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(dirty, 0);
}

#[sqlx::test(migrations = false)]
async fn fact_writes_do_not_ring_while_a_rebuilder_polls(pool: PgPool) {
    migrate(&pool).await;
    let mut listener = sqlx::postgres::PgListener::connect_with(&pool)
        .await
        .unwrap();
    listener.listen(digest::FACTS_CHANNEL).await.unwrap();
    sqlx::query(
        "INSERT INTO digest_pollers (rebuilder, until) VALUES ('r1', now() + interval '1 hour')",
    )
    .execute(&pool)
    .await
    .unwrap();
    fact(&pool, "quiet", "debt", "bank", "Owes 5").await;
    sqlx::query("DELETE FROM digest_pollers")
        .execute(&pool)
        .await
        .unwrap();
    fact(&pool, "loud", "debt", "bank", "Owes 6").await;
    // Notifications arrive in commit order: the first one is the second write's.
    let first = listener.recv().await.unwrap();
    assert_eq!(first.payload(), "loud");
    // The silent write is still marked, and a poll finds it.
    let metrics = kvmem::metrics::Metrics::new();
    let swept = digest::sweep(&pool, 180, &kvmem::context::tokens::WordCount, &metrics)
        .await
        .unwrap();
    assert_eq!(swept, 2);
    assert_eq!(rebuild_events(&pool, "quiet").await, 1);
}

async fn wait_for_digest(pool: &PgPool, sid: &str, ok: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let row: Option<(String, String)> = sqlx::query_as(
            "SELECT digest_version, digest_content FROM state_digest WHERE session_id = $1",
        )
        .bind(sid)
        .fetch_optional(pool)
        .await
        .unwrap();
        if let Some((v, c)) = row {
            if ok(&c) {
                return v;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "digest for {sid} never matched"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[sqlx::test(migrations = false)]
async fn hud_renders_exactly_falls_back_and_fits_its_budget(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let engine = load_engine(&tiny_model(), &settings(serde_json::json!({})));
    let row = hud::fetch(&pool, ch, "u1")
        .await
        .unwrap()
        .expect("own character");
    // adherence = (100 - 20*0.3) + (70-50)*0.1 + (60-50)*0.2 + (55-50)*0.15 = 98.75 -> 99
    assert_eq!(
        hud::render(&row),
        "HUD: HP 85/100 • Credits: 1250 • Stress: 20 • Trust: 70 • Adherence: 99% • Equip: Plasma Sword"
    );
    // Within budget nothing is trimmed; SmolLM2's tokenizer needs 46 tokens for this line,
    // so at the default 40 it is trimmed to fit.
    assert_eq!(
        hud::render_within(&row, 100, engine.as_ref()),
        hud::render(&row)
    );
    let fitted = hud::render_within(&row, 40, engine.as_ref());
    assert!(engine.count_tokens(&fitted) <= 40, "{fitted}");
    assert!(
        fitted.starts_with("HUD: HP 85/100 • Credits: 1250 • Stress: 20"),
        "{fitted}"
    );
    // Another user asking for this character gets nothing, hence the minimal HUD.
    let other = hud::fetch(&pool, ch, "u2").await;
    assert!(matches!(other, Ok(None)));
    assert_eq!(
        hud::line_or_minimal(&other, 40, engine.as_ref()),
        hud::MINIMAL_HUD
    );
    // Clamping: extreme stats stay within 0..100.
    let stressed = hud_after(&pool, ch, "stress_level = 400").await;
    assert_eq!(stressed.adherence, 0);
    // A long equipment name is shortened to fit, deterministically.
    let mut long = row.clone();
    long.equipment =
        "Quantum-entangled hyperdimensional plasma lance of the ninth orbital legion".into();
    let mut bare = long.clone();
    bare.equipment = String::new();
    let budget = engine.count_tokens(&hud::render(&bare)) + 6;
    let line = hud::render_within(&long, budget, engine.as_ref());
    assert!(engine.count_tokens(&line) <= budget, "{line}");
    assert!(
        line.starts_with("HUD: HP 85/100 • Credits: 1250")
            && line.contains("Equip: Quantum")
            && line.ends_with('…'),
        "{line}"
    );
    assert_eq!(line, hud::render_within(&long, budget, engine.as_ref()));
    // A missing equipment row renders as Unarmed (LEFT JOIN).
    let unarmed = hud_after(&pool, ch, "primary_equipment_id = NULL").await;
    assert_eq!(unarmed.equipment, "Unarmed");
}

/// u1's HUD row for character `ch` after `SET change` on its user_characters row.
async fn hud_after(pool: &PgPool, ch: i64, change: &str) -> hud::HudRow {
    sqlx::query(&format!(
        "UPDATE user_characters SET {change} WHERE id = $1"
    ))
    .bind(ch)
    .execute(pool)
    .await
    .unwrap();
    hud::fetch(pool, ch, "u1")
        .await
        .unwrap()
        .expect("u1's HUD row")
}
