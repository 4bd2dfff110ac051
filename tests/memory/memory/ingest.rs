//! Import, live turns into the corpus, the lane's backlog and its jobs.

use super::*;

#[sqlx::test(migrations = false)]
async fn import_is_idempotent_and_reports_bad_lines(pool: PgPool) {
    let svc = service(&pool).await;
    let first = import_fixture(&svc).await;
    assert_eq!(
        (
            first.imported,
            first.skipped_duplicate,
            first.rejected,
            first.embedded
        ),
        (5, 0, 0, 5)
    );
    let second = import_fixture(&svc).await;
    assert_eq!((second.imported, second.skipped_duplicate), (0, 5));
    assert_eq!(
        count(&pool, "SELECT count(*) FROM memory_messages").await,
        5
    );
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"user_id\":\"c\",\"session_id\":\"s\",\"message_id\":\"1\",\"speaker\":\"C\",\"text\":\"hello there\",\"at\":\"2024-01-01T00:00:00Z\"}\n\
         {\"user_id\":\"c\",\"session_id\":\"s\",\"message_id\":\"2\",\"speaker\":\"C\",\"text\":\"hi\",\"at\":\"tuesday\"}\n\
         not json\n",
    )
    .unwrap();
    let strict = import::import_file(&svc, &bad, ExtractMode::None, true, false).await;
    assert!(strict.unwrap_err().to_string().contains("line 2"));
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM memory_messages WHERE user_id = 'c'"
        )
        .await,
        0
    );
    let lax = import::import_file(&svc, &bad, ExtractMode::None, false, false)
        .await
        .unwrap();
    assert_eq!((lax.imported, lax.rejected), (1, 2));
    assert!(
        lax.rejections[0].starts_with("line 2: at"),
        "{:?}",
        lax.rejections
    );
    assert!(lax.rejections[1].starts_with("line 3: not a valid record"));
}

#[sqlx::test(migrations = false)]
async fn live_turn_messages_feed_the_corpus_and_the_lane(pool: PgPool) {
    let svc = service(&pool).await;
    let ch = common::character(&pool, "carol", "Vega").await;
    let turn: i64 = sqlx::query_scalar(
        "INSERT INTO turns (session_id, user_id, character_id, message, state) VALUES ('s1', 'carol', $1, 'x', 'done') RETURNING id",
    )
    .bind(ch)
    .fetch_one(&pool)
    .await
    .unwrap();
    for (role, text) in [
        ("user", "I finally booked my trip to Kyoto"),
        ("assistant", "Wonderful, enjoy the temples!"),
    ] {
        sqlx::query(
            "INSERT INTO messages (session_id, turn_id, role, content) VALUES ('s1', $1, $2, $3)",
        )
        .bind(turn)
        .bind(role)
        .bind(text)
        .execute(&pool)
        .await
        .unwrap();
    }
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM memory_messages WHERE user_id = 'carol'"
        )
        .await,
        2
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM memory_jobs WHERE kind = 'ingest' AND state = 'queued'"
        )
        .await,
        2
    );
    let out = jobs::drain(&svc).await.unwrap();
    assert_eq!(out.len(), 2);
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM memory_messages WHERE embedding IS NOT NULL"
        )
        .await,
        2
    );
    let res = search::search(&svc, &req("carol", "vacation in Japan", RankerKind::Hybrid))
        .await
        .unwrap();
    assert_eq!(res.hits[0].id, format!("turn:{turn}:user"));
    assert!(matches!(
        jobs::process_next_memory_job(&svc).await.unwrap(),
        Outcome::Empty
    ));
}

/// A migrated database whose memory backlog holds at most `cap` queued ingest jobs a user.
async fn migrate_with_backlog_cap(pool: &PgPool, cap: i32) {
    common::migrate(pool).await;
    sqlx::query("UPDATE kvmem_config SET value = $1::text WHERE key = 'memory_backlog_max'")
        .bind(cap)
        .execute(pool)
        .await
        .unwrap();
}

/// A completion batch inserts many users' messages in one statement; the backlog rule
/// still holds per user, and one user's overflow drops none of another's jobs.
#[sqlx::test(migrations = false)]
async fn one_statement_of_many_messages_keeps_the_backlog_rule_per_user(pool: PgPool) {
    migrate_with_backlog_cap(&pool, 3).await;
    let mut turns = Vec::new();
    for (user, n) in [("dora", 3), ("eli", 1)] {
        let ch = common::character(&pool, user, "Vega").await;
        for i in 0..n {
            let id: i64 = sqlx::query_scalar(
                "INSERT INTO turns (session_id, user_id, character_id, message, state)
                 VALUES ($1, $2, $3, 'x', 'done') RETURNING id",
            )
            .bind(format!("{user}-s"))
            .bind(user)
            .bind(ch)
            .fetch_one(&pool)
            .await
            .unwrap();
            turns.push((id, format!("{user}-s"), i));
        }
    }
    // Interleaved as a batch of turns from two users is: dora, dora, eli, dora.
    let order = [0usize, 1, 3, 2];
    let mut values = Vec::new();
    for &k in &order {
        let (id, sid, i) = &turns[k];
        values.push(format!("('{sid}', {id}, 'user', 'message {i}')"));
        values.push(format!("('{sid}', {id}, 'assistant', 'reply {i}')"));
    }
    sqlx::query(&format!(
        "INSERT INTO messages (session_id, turn_id, role, content) VALUES {}",
        values.join(", ")
    ))
    .execute(&pool)
    .await
    .unwrap();

    let dora: Vec<(String, String)> = sqlx::query_as(
        "SELECT m.message_id, j.state FROM memory_jobs j
           JOIN memory_messages m ON m.id = j.memory_message_id
          WHERE j.user_id = 'dora' ORDER BY j.id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let states: Vec<&str> = dora.iter().map(|(_, s)| s.as_str()).collect();
    assert_eq!(
        states,
        ["dropped", "dropped", "dropped", "queued", "queued", "queued"],
        "dora's six messages leave the newest three: {dora:?}"
    );
    let expected_first = format!("turn:{}:user", turns[0].0);
    assert_eq!(dora[0].0, expected_first, "jobs follow message order");
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM memory_jobs WHERE user_id = 'eli' AND state = 'queued'"
        )
        .await,
        2
    );
    assert_eq!(
        count(
            &pool,
            "SELECT coalesce(sum(dropped), 0)::bigint FROM memory_job_drops WHERE user_id = 'dora'"
        )
        .await,
        3
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM memory_job_drops WHERE user_id = 'eli'"
        )
        .await,
        0
    );
}

#[sqlx::test(migrations = false)]
async fn backlog_overflow_drops_oldest_and_counts(pool: PgPool) {
    migrate_with_backlog_cap(&pool, 3).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO memory_messages (user_id, session_id, message_id, speaker, text, at)
             VALUES ('d', 's', $1, 'D', 'some message text', now()) RETURNING id",
        )
        .bind(format!("m{i}"))
        .fetch_one(&pool)
        .await
        .unwrap();
        sqlx::query("SELECT kvmem_memory_queue_ingest($1)")
            .bind(id)
            .execute(&pool)
            .await
            .unwrap();
        // Same-message dedup: queueing twice adds nothing.
        sqlx::query("SELECT kvmem_memory_queue_ingest($1)")
            .bind(id)
            .execute(&pool)
            .await
            .unwrap();
        ids.push(id);
    }
    assert_eq!(count(&pool, "SELECT count(*) FROM memory_jobs").await, 5);
    let dropped: Vec<i64> = sqlx::query_scalar(
        "SELECT memory_message_id FROM memory_jobs WHERE state = 'dropped' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(dropped, ids[..2].to_vec());
    assert_eq!(
        count(
            &pool,
            "SELECT dropped FROM memory_job_drops WHERE user_id = 'd'"
        )
        .await,
        2
    );
}

/// `import --extract llm` then `memory work`: a process without an extraction model leaves
/// the jobs queued and says so; one with the model runs the extractor on every message.
#[sqlx::test(migrations = false)]
async fn memory_work_never_marks_an_extraction_done_without_running_it(pool: PgPool) {
    common::migrate(&pool).await;
    let url = common::db_url(&pool).await;
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/memory_chats.jsonl"
    );
    let out = common::kvmem_command(&url)
        .env("KVMEM_MEMORY_EMBED_MODEL_PATH", default_embedder())
        .args([
            "memory",
            "import",
            "--file",
            fixture,
            "--extract",
            "llm",
            "--json",
        ])
        .output()
        .unwrap();
    common::assert_success(&out);
    let rep: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rep["queued_for_extraction"], 5);
    let jobs = |state: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM memory_jobs WHERE state = $1")
                .bind(state)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let out = common::kvmem_command(&url)
        .env("KVMEM_MEMORY_EMBED_MODEL_PATH", default_embedder())
        .env("KVMEM_MEMORY_EXTRACT", "false")
        .args(["memory", "work"])
        .output()
        .unwrap();
    common::assert_success(&out);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "ran 0 memory job(s)"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("5 job(s) ask for fact extraction"), "{err}");
    assert_eq!(jobs("queued").await, 5);
    assert_eq!(jobs("done").await, 0);

    let out = common::kvmem_command(&url)
        .env("KVMEM_MEMORY_EMBED_MODEL_PATH", default_embedder())
        .env("KVMEM_MEMORY_EXTRACT", "true")
        .env("KVMEM_MEMORY_EXTRACT_MODEL_PATH", common::tiny_model())
        .args(["memory", "work"])
        .output()
        .unwrap();
    common::assert_success(&out);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "ran 5 memory job(s)"
    );
    assert_eq!(jobs("queued").await, 0);
    // Every job ran the extractor (no speaker in the fixture is the character's "assistant").
    let results: Vec<(String, serde_json::Value)> = sqlx::query_as(
        "SELECT m.speaker, j.result FROM memory_jobs j \
           JOIN memory_messages m ON m.id = j.memory_message_id WHERE j.state = 'done'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(results.len(), 5);
    for (speaker, r) in &results {
        let ran = r["extracted"] == true || r.get("extract_error").is_some();
        assert_eq!(ran, speaker != "assistant", "{speaker}: {r}");
    }
}

#[sqlx::test(migrations = false)]
async fn an_orphaned_running_job_is_run_again(pool: PgPool) {
    let svc = service(&pool).await;
    let job: i64 = sqlx::query_scalar("SELECT kvmem_remember('f', NULL, 'likes green tea')")
        .fetch_one(&pool)
        .await
        .unwrap();
    // A worker claimed it and died: running, started long ago.
    sqlx::query("UPDATE memory_jobs SET state = 'running', started_at = now() - interval '10 minutes' WHERE id = $1")
        .bind(job)
        .execute(&pool)
        .await
        .unwrap();
    let out = jobs::drain(&svc).await.unwrap();
    assert!(
        matches!(&out[..], [Outcome::Done { job_id, .. }] if *job_id == job),
        "{out:?}"
    );
    // A fresh running job of another worker is left alone.
    let other: i64 = sqlx::query_scalar("SELECT kvmem_remember('f', NULL, 'likes black coffee')")
        .fetch_one(&pool)
        .await
        .unwrap();
    sqlx::query("UPDATE memory_jobs SET state = 'running', started_at = now() WHERE id = $1")
        .bind(other)
        .execute(&pool)
        .await
        .unwrap();
    assert!(matches!(
        jobs::process_next_memory_job(&svc).await.unwrap(),
        Outcome::Empty
    ));
}
