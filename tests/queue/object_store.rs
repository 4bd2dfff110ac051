//! Snapshots in an S3-compatible object store (the moto server `ops/s3` starts, named by
//! `KVMEM_TEST_S3_ENDPOINT`), with each worker's local cache in front of it, on the tiny
//! GGUF model: round trips through a fresh cache, a stale cache, a corrupt object, a
//! foreign object, eviction by bytes, an unreachable store, and claim affinity.

use crate::common;

use common::*;
use kvmem::runner::Deps;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, PutPayload};
use sqlx::PgPool;

fn s3_settings(
    dir: &std::path::Path,
    bucket: &str,
    extra: serde_json::Value,
) -> kvmem::config::Settings {
    settings(serde_json::json!({
        "kv_dir": dir, "n_ctx": 1024, "kv_tail_tokens": 512, "reply_max_tokens": 16,
        "snapshot_store": "s3", "s3_endpoint": endpoint(), "s3_bucket": bucket,
        "s3_access_key_id": "test", "s3_secret_access_key": "test", "s3_timeout_ms": 5000,
    }))
    .with(extra)
    .unwrap()
}

fn object(scope: &str) -> ObjectPath {
    ObjectPath::from(format!("kvmem/snapshots/{scope}.llkv"))
}

/// One counter of a worker's `/metrics`.
async fn counter(deps: &Deps, name: &str) -> f64 {
    let samples = counter_samples(deps, name).await;
    let first = samples.first().map(|(_, v)| *v);
    first.unwrap_or_else(|| panic!("{name} missing from /metrics"))
}

async fn kv_source(pool: &PgPool, turn_id: i64) -> Option<String> {
    sqlx::query_scalar("SELECT kv_source FROM turn_log WHERE turn_id = $1 ORDER BY id DESC LIMIT 1")
        .bind(turn_id)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrations = false)]
async fn snapshots_round_trip_through_the_object_store_and_a_stale_cache_is_not_trusted(
    pool: PgPool,
) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let (bucket, s3) = bucket("round-trip").await;
    let (dir1, dir2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let s1 = s3_settings(dir1.path(), &bucket, serde_json::json!({}));
    let engine = load_engine(&tiny_model(), &s1);
    let w1 = llama_deps(&pool, s1, engine.clone(), "w1");
    let w2 = llama_deps(
        &pool,
        s3_settings(dir2.path(), &bucket, serde_json::json!({})),
        engine,
        "w2",
    );
    let scope = kvmem::snapshot::scope_key("u1", ch, "s");

    let (t1, log) = one_turn(&w1, "s", "u1", ch, "Hello there, Ada.").await;
    assert_eq!(
        (log.status.as_str(), log.cold),
        ("OK", true),
        "{:?}",
        log.error
    );
    // Write-through: the object is in the bucket and equals the cached file byte for byte.
    let remote = s3
        .get(&object(&scope))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let local = std::fs::read(dir1.path().join(format!("{scope}.llkv"))).unwrap();
    assert_eq!(remote.as_ref(), local.as_slice());
    assert_eq!(kv_source(&pool, t1.0).await, None);

    let (t2, log) = one_turn(&w1, "s", "u1", ch, "What do you carry?").await;
    assert!(!log.cold, "{:?}", log.cold_reason);
    assert_eq!(kv_source(&pool, t2.0).await.as_deref(), Some("cache"));
    assert_eq!(counter(&w1, "kvmem_snapshot_cache_hits_total").await, 1.0);

    // Another worker with an empty cache resumes the session warm from the bucket.
    let (t3, log) = one_turn(&w2, "s", "u1", ch, "And where are we going?").await;
    assert!(!log.cold, "{:?}", log.cold_reason);
    assert_eq!(kv_source(&pool, t3.0).await.as_deref(), Some("remote"));
    assert_eq!(counter(&w2, "kvmem_snapshot_cache_misses_total").await, 1.0);
    let (t4, log) = one_turn(&w2, "s", "u1", ch, "Tell me more.").await;
    assert!(!log.cold);
    assert_eq!(kv_source(&pool, t4.0).await.as_deref(), Some("cache"));

    // Back on w1, whose cached copy holds turn 2: it is stale, so the bucket's is read.
    let cached = w1.snapshots.as_ref().expect("w1's store").files();
    match cached.load(&scope) {
        kvmem::snapshot::Loaded::Found(snap) => assert_eq!(snap.header.turn_id, t2.0),
        other => panic!("w1's cache should still hold turn 2: {other:?}"),
    }
    let (t5, log) = one_turn(&w1, "s", "u1", ch, "Good. Lead on.").await;
    assert!(!log.cold, "{:?}", log.cold_reason);
    assert_eq!(kv_source(&pool, t5.0).await.as_deref(), Some("remote"));
    assert_eq!(counter(&w1, "kvmem_snapshot_cache_misses_total").await, 2.0);
    assert_eq!(
        counter(&w1, "kvmem_snapshot_remote_errors_total").await,
        0.0
    );
    let replies: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM messages WHERE session_id = 's' AND role = 'assistant'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(replies, 5);
}

#[sqlx::test(migrations = false)]
async fn a_corrupt_object_is_quarantined_and_another_tenants_object_is_refused(pool: PgPool) {
    migrate(&pool).await;
    let ada = character(&pool, "u1", "Ada").await;
    let bo = character(&pool, "u2", "Bo").await;
    let (bucket, s3) = bucket("corrupt").await;
    let dir1 = tempfile::tempdir().unwrap();
    let s1 = s3_settings(dir1.path(), &bucket, serde_json::json!({}));
    let engine = load_engine(&tiny_model(), &s1);
    let w1 = llama_deps(&pool, s1, engine.clone(), "w1");
    let fresh = |name| {
        let dir = tempfile::tempdir().unwrap();
        let deps = llama_deps(
            &pool,
            s3_settings(dir.path(), &bucket, serde_json::json!({})),
            engine.clone(),
            name,
        );
        (dir, deps)
    };
    let ada_scope = kvmem::snapshot::scope_key("u1", ada, "s");
    let bo_scope = kvmem::snapshot::scope_key("u2", bo, "b");
    one_turn(&w1, "s", "u1", ada, "Hello there, Ada.").await;
    one_turn(&w1, "b", "u2", bo, "Hello there, Bo.").await;

    // Flip one byte of Ada's object: a fresh worker must not restore it.
    let mut bytes = s3
        .get(&object(&ada_scope))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .to_vec();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    s3.put(&object(&ada_scope), PutPayload::from(bytes))
        .await
        .unwrap();
    let (_d2, w2) = fresh("w2");
    let (t2, log) = one_turn(&w2, "s", "u1", ada, "Still there?").await;
    assert_eq!(log.status, "OK", "{:?}", log.error);
    assert!(
        log.cold && log.cold_reason.as_deref().unwrap_or("").contains("corrupt"),
        "{:?}",
        log.cold_reason
    );
    let quarantined: Vec<String> = keys(&s3)
        .await
        .into_iter()
        .filter(|k| k.contains("quarantine/") && k.contains(&ada_scope))
        .collect();
    assert_eq!(quarantined.len(), 1, "{:?}", keys(&s3).await);
    let event: serde_json::Value = sqlx::query_scalar(
        "SELECT detail FROM events WHERE turn_id = $1 AND kind = 'snapshot_quarantined'",
    )
    .bind(t2.0)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        event["file"]
            .as_str()
            .unwrap()
            .ends_with(quarantined[0].as_str()),
        "{event}"
    );
    // The turn saved a good snapshot again, which the next turn trusts.
    let (_, log) = one_turn(&w2, "s", "u1", ada, "Good.").await;
    assert!(!log.cold, "{:?}", log.cold_reason);

    // Copy Ada's good object over Bo's key: Bo's next turn on a fresh worker refuses it
    // (it belongs to another scope) instead of resuming from Ada's conversation.
    s3.copy(&object(&ada_scope), &object(&bo_scope))
        .await
        .unwrap();
    let (_d3, w3) = fresh("w3");
    let (_, log) = one_turn(&w3, "b", "u2", bo, "Bo, what did Ada say?").await;
    assert_eq!(log.status, "OK");
    assert!(
        log.cold
            && log
                .cold_reason
                .as_deref()
                .unwrap_or("")
                .contains("another scope"),
        "{:?}",
        log.cold_reason
    );
    let text: String = kv_segments(&pool, &engine, "b")
        .await
        .into_iter()
        .map(|(_, text)| text)
        .collect();
    assert!(text.contains("Bo, what did Ada say?"), "{text}");
    assert!(
        !text.contains("Hello there, Ada"),
        "Bo's KV holds Ada's dialogue: {text}"
    );
}

#[sqlx::test(migrations = false)]
async fn the_cache_is_evicted_by_bytes_and_an_evicted_session_resumes_from_the_bucket(
    pool: PgPool,
) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let (bucket, _s3) = bucket("evict").await;
    let probe_dir = tempfile::tempdir().unwrap();
    let probe = s3_settings(probe_dir.path(), &bucket, serde_json::json!({}));
    let engine = load_engine(&tiny_model(), &probe);
    let w0 = llama_deps(&pool, probe, engine.clone(), "w0");
    one_turn(&w0, "probe", "u1", ch, "Hello there, Ada, session 0.").await;
    let one = std::fs::metadata(files_with_ext(probe_dir.path(), ".llkv")[0].clone())
        .unwrap()
        .len();
    // Room for two snapshots of this size, not three.
    let cap = one * 5 / 2;
    let dir = tempfile::tempdir().unwrap();
    let w1 = llama_deps(
        &pool,
        s3_settings(
            dir.path(),
            &bucket,
            serde_json::json!({ "kv_cache_bytes": cap }),
        ),
        engine,
        "w1",
    );
    for i in 1..=4 {
        let (_, log) = one_turn(
            &w1,
            &format!("s{i}"),
            "u1",
            ch,
            &format!("Hello there, Ada, session {i}."),
        )
        .await;
        assert_eq!(log.status, "OK");
    }
    let store = w1.snapshots.as_ref().expect("a llama worker");
    let held = store.settle_cache();
    let files = files_with_ext(dir.path(), ".llkv");
    let on_disk: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum();
    assert!(
        held <= cap && on_disk <= cap,
        "cache holds {held} / {on_disk} bytes over a cap of {cap}"
    );
    assert!(files.len() < 4, "{files:?}");
    assert!(counter(&w1, "kvmem_snapshot_cache_evictions_total").await >= 2.0);
    // The least recently used session went first; its next turn reads the bucket, warm.
    let s1 = kvmem::snapshot::scope_key("u1", ch, "s1");
    assert!(!dir.path().join(format!("{s1}.llkv")).exists());
    let (t, log) = one_turn(&w1, "s1", "u1", ch, "Back again.").await;
    assert!(!log.cold, "{:?}", log.cold_reason);
    assert_eq!(kv_source(&pool, t.0).await.as_deref(), Some("remote"));
}

#[sqlx::test(migrations = false)]
async fn an_unreachable_store_makes_cold_turns_not_lost_ones(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    // A loopback port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let unreachable = |dir: &std::path::Path| {
        s3_settings(
            dir,
            "nowhere",
            serde_json::json!({ "s3_endpoint": format!("http://127.0.0.1:{port}"), "s3_timeout_ms": 1000 }),
        )
    };
    let (dir1, dir2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let s1 = unreachable(dir1.path());
    let engine = load_engine(&tiny_model(), &s1);
    let w1 = llama_deps(&pool, s1, engine.clone(), "w1");
    let w2 = llama_deps(&pool, unreachable(dir2.path()), engine, "w2");
    let (_, log) = one_turn(&w1, "s", "u1", ch, "Hello there, Ada.").await;
    assert_eq!(log.status, "OK", "{:?}", log.error);
    // The save could not reach the store: counted, and the reply committed all the same.
    assert!(counter(&w1, "kvmem_snapshot_remote_errors_total").await >= 1.0);
    // A worker with nothing cached cannot read the session's snapshot: it runs cold.
    let (t2, log) = one_turn(&w2, "s", "u1", ch, "Are you still there?").await;
    assert_eq!(log.status, "OK", "{:?}", log.error);
    let reason = log.cold_reason.unwrap_or_default();
    assert!(log.cold && reason.contains("object store"), "{reason}");
    assert_eq!(kv_source(&pool, t2.0).await, None);
    let (turns, replies): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM turns WHERE session_id = 's' AND state = 'done'),
                (SELECT count(*) FROM messages WHERE session_id = 's' AND role = 'assistant')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((turns, replies), (2, 2));
}

#[sqlx::test(migrations = false)]
async fn claims_prefer_the_last_worker_for_a_bounded_wait(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let lanes = vec!["live".to_string()];
    // Session a's first turn runs on w1 (the echo generator: queue mechanics only).
    let w1 = echo_deps(&pool, settings(serde_json::json!({})), "w1");
    one_turn(&w1, "a", "u1", ch, "one").await;
    let a2 = kvmem::queue::enqueue(&pool, "a", "u1", ch, "two", None)
        .await
        .unwrap();
    let b1 = kvmem::queue::enqueue(&pool, "b", "u1", ch, "one", None)
        .await
        .unwrap();
    let hour = Some(std::time::Duration::from_secs(3600));
    // w2 leaves a to w1 and takes b, which nobody ran yet.
    let got = kvmem::queue::claim_preferring(&pool, "w2", 30_000, &lanes, 5, hour)
        .await
        .unwrap();
    assert_eq!(got.iter().map(|t| t.id).collect::<Vec<_>>(), vec![b1]);
    // w1 takes its own session.
    let got = kvmem::queue::claim_preferring(&pool, "w1", 30_000, &lanes, 5, hour)
        .await
        .unwrap();
    assert_eq!(got.iter().map(|t| t.id).collect::<Vec<_>>(), vec![a2]);

    // Once a session has waited out the bound, any worker takes it.
    one_turn(&w1, "c", "u1", ch, "one").await;
    let c2 = kvmem::queue::enqueue(&pool, "c", "u1", ch, "two", None)
        .await
        .unwrap();
    let none = kvmem::queue::claim_preferring(&pool, "w2", 30_000, &lanes, 5, hour)
        .await
        .unwrap();
    assert!(none.is_empty(), "{none:?}");
    let zero = Some(std::time::Duration::ZERO);
    let got = kvmem::queue::claim_preferring(&pool, "w2", 30_000, &lanes, 5, zero)
        .await
        .unwrap();
    assert_eq!(got.iter().map(|t| t.id).collect::<Vec<_>>(), vec![c2]);
    // The session now belongs to w2.
    let last: String =
        sqlx::query_scalar("SELECT last_owner FROM session_locks WHERE session_id = 'c'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(last, "w2");
}

/// What `erase` and the quarantine sweep remove from the bucket and the directory, and
/// that another scope's snapshot and quarantined copies are left alone.
#[sqlx::test(migrations = false)]
async fn erase_and_the_quarantine_sweep_remove_one_scope_from_the_bucket_and_the_cache(
    pool: PgPool,
) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let (bucket, s3) = bucket("erase").await;
    let dir = tempfile::tempdir().unwrap();
    let settings = s3_settings(dir.path(), &bucket, serde_json::json!({}));
    let engine = load_engine(&tiny_model(), &settings);
    let w = llama_deps(&pool, settings, engine, "w1");
    for sid in ["s1", "s2"] {
        one_turn(&w, sid, "u1", ch, "Hello there, Ada.").await;
    }
    let (gone, kept) = (
        kvmem::snapshot::scope_key("u1", ch, "s1"),
        kvmem::snapshot::scope_key("u1", ch, "s2"),
    );
    let now = chrono::Utc::now().timestamp_millis();
    let quarantined = |scope: &str, at: i64| {
        ObjectPath::from(format!("kvmem/snapshots/quarantine/{scope}.{at}.bad"))
    };
    for (scope, at, len) in [
        (&gone, now, 7),
        (&gone, 1000, 5),
        (&kept, now, 3),
        (&kept, 1000, 2),
    ] {
        s3.put(&quarantined(scope, at), PutPayload::from(vec![0u8; len]))
            .await
            .unwrap();
    }
    std::fs::write(dir.path().join(format!("{gone}.{now}.bad")), [0u8; 11]).unwrap();
    let object_len = s3.head(&object(&gone)).await.unwrap().size;
    let file_len = std::fs::metadata(dir.path().join(format!("{gone}.llkv")))
        .unwrap()
        .len();
    let store = w.snapshots.as_ref().expect("a llama worker");
    let erased = store.erase(&gone).await.unwrap();
    assert_eq!(
        erased,
        kvmem::snapshot::ScopeErased {
            files: 1,
            quarantined: 1,
            objects: 3,
            bytes: file_len + 11 + object_len + 7 + 5,
        }
    );
    let left = keys(&s3).await;
    assert!(left.iter().all(|k| !k.contains(&gone)), "{left:?}");
    assert_eq!(
        left.iter().filter(|k| k.contains(&kept)).count(),
        3,
        "{left:?}"
    );
    let files = files_with_ext(dir.path(), "");
    assert!(
        files.iter().all(|f| !f.to_string_lossy().contains(&gone)),
        "{files:?}"
    );
    assert!(dir.path().join(format!("{kept}.llkv")).exists());
    assert_eq!(
        store.erase(&gone).await.unwrap(),
        kvmem::snapshot::ScopeErased::default()
    );
    // The sweep takes the other scope's old quarantined object, not its recent one.
    let swept = store
        .sweep_quarantine(std::time::Duration::from_secs(7 * 86400))
        .await
        .unwrap();
    assert_eq!((swept.files, swept.objects, swept.bytes), (0, 1, 2));
    let left = keys(&s3).await;
    assert!(
        left.contains(&quarantined(&kept, now).to_string()),
        "{left:?}"
    );
    assert!(
        !left.contains(&quarantined(&kept, 1000).to_string()),
        "{left:?}"
    );
    assert_eq!(
        counter(&w, "kvmem_snapshot_quarantine_removed_total").await,
        1.0
    );
}

#[sqlx::test(migrations = false)]
async fn the_rotate_hint_reads_the_bucket_when_the_cache_holds_an_older_snapshot_or_none(
    pool: PgPool,
) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let (bucket, _s3) = bucket("hint").await;
    let (dir1, dir2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let s1 = s3_settings(dir1.path(), &bucket, serde_json::json!({}));
    let engine = load_engine(&tiny_model(), &s1);
    let w1 = llama_deps(&pool, s1.clone(), engine.clone(), "w1");
    let s2 = s3_settings(dir2.path(), &bucket, serde_json::json!({}));
    let w2 = llama_deps(&pool, s2, engine, "w2");
    one_turn(&w1, "s", "u1", ch, "Hello there, Ada.").await;
    // The second turn runs on w2: w1's cache keeps the first turn's, shorter snapshot.
    one_turn(&w2, "s", "u1", ch, "Tell me about the harbour.").await;
    let scope = kvmem::snapshot::scope_key("u1", ch, "s");
    let tokens_in = |dir: &std::path::Path| {
        let bytes = std::fs::read(dir.join(format!("{scope}.llkv"))).unwrap();
        let limits = kvmem::snapshot::Limits::LOOSE;
        kvmem::snapshot::parse_header(&bytes, limits)
            .unwrap()
            .0
            .tokens
    };
    let (older, latest) = (tokens_in(dir1.path()), tokens_in(dir2.path()));
    assert!(
        latest > older,
        "{latest} tokens after two turns, {older} after one"
    );
    let store = w1.snapshots.clone().expect("a llama worker");
    let state = crate::common::http_state(pool.clone(), std::sync::Arc::new(s1), "ab".repeat(32))
        .with_snapshots(store);
    let server = serve(state, None).await;
    let hint = || async {
        let url = format!("{}/v1/rotate-hint?sid=s&user=u1", server.base);
        let got = reqwest::get(url).await.unwrap();
        assert_eq!(got.status(), 200);
        got.json::<serde_json::Value>().await.unwrap()
    };
    let first = hint().await;
    assert_eq!(first["tokens_in_kv"], latest, "{first}");
    std::fs::remove_file(dir1.path().join(format!("{scope}.llkv"))).unwrap();
    let uncached = hint().await;
    assert_eq!(uncached["snapshot"], true, "{uncached}");
    assert_eq!(uncached["tokens_in_kv"], latest, "{uncached}");
}
