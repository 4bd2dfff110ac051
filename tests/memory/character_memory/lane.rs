//! The memory lane beside turns: a failing extractor, and whose fact a fact is.

use super::*;

/// Until `ready` holds, or fail after `limit`: the worker runs in its own task, and the
/// test waits on the database state it must reach, not on a fixed delay.
async fn until<F, Fut>(what: &str, limit: std::time::Duration, mut ready: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + limit;
    while !ready().await {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[derive(Debug, sqlx::FromRow)]
struct IngestRow {
    speaker: String,
    state: String,
    embedded: bool,
    result: Option<serde_json::Value>,
}

/// Issue 34: an extraction model that cannot run never stands between a user and their
/// turns, and never loses a message. Two ways it fails, both beside real turns (the tiny
/// model) and the real embedder: the configured file is not a model, so it never loads
/// (a running worker: its lane still embeds); or it loads (the tiny model) into a context
/// too small for the instruction, so every call fails (the lane drained by hand, as
/// `kvmem memory work` runs it). Every turn is served, every message is kept and embedded,
/// every ingest job ends `done`, and each failure is an `events` row, not a lost job.
#[sqlx::test(migrations = false)]
async fn a_failing_extractor_never_blocks_a_turn_or_loses_a_message(pool: PgPool) {
    migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let not_a_model = dir.path().join("not-a-model.gguf");
    std::fs::write(&not_a_model, b"this is not a gguf file").unwrap();
    let said = [
        "my brother felix is a firefighter in graz",
        "i teach chemistry at a secondary school",
        "my wife noor is a pharmacist and she works nights",
    ];
    for user in ["cannot-load", "every-call-fails"] {
        let ch = character(&pool, user, "Ada").await;
        let s = settings(serde_json::json!({
            "kv_dir": dir.path().join(user), "reply_max_tokens": 8,
            "memory_lane": true, "summary_lane": false, "memory_extract": true,
            "memory_extract_model_path": not_a_model, "memory_embed_model_path": default_embedder(),
        }));
        let engine = load_engine(&tiny_model(), &s);
        let deps = llama_deps(&pool, s.clone(), engine, user);
        let sid = format!("s-{user}");
        for m in said {
            kvmem::queue::enqueue(&pool, &sid, user, ch, m, None)
                .await
                .unwrap();
        }
        if user == "cannot-load" {
            let shutdown = tokio_util::sync::CancellationToken::new();
            let worker = tokio::spawn(kvmem::runner::run(deps, shutdown.clone()));
            let all_done = || async {
                let (turns, jobs): (i64, i64) = sqlx::query_as(
                    "SELECT (SELECT count(*) FROM turns WHERE user_id = $1 AND state = 'done'),
                            (SELECT count(*) FROM memory_jobs
                              WHERE user_id = $1 AND state = 'done')",
                )
                .bind(user)
                .fetch_one(&pool)
                .await
                .unwrap();
                turns == said.len() as i64 && jobs == 2 * said.len() as i64
            };
            until(user, std::time::Duration::from_secs(120), all_done).await;
            shutdown.cancel();
            worker.await.unwrap().unwrap();
        } else {
            assert_eq!(drain(&deps).await.len(), said.len());
            let mut params = kvmem::engine::EngineParams::from_settings(&s);
            params.n_ctx = 64;
            let engine = kvmem::system::load_engine(&tiny_model(), None, params).unwrap();
            let extractor =
                kvmem::memory::ingest::llm::LlmExtractor::start(std::sync::Arc::new(engine), None)
                    .unwrap();
            let lane = kvmem::system::memory_service(pool.clone(), &s, true)
                .await
                .unwrap()
                .with_extractor(std::sync::Arc::new(extractor));
            kvmem::memory::ingest::jobs::drain(&lane).await.unwrap();
        }

        let rows: Vec<IngestRow> = sqlx::query_as(
            "SELECT m.speaker, j.state, m.embedding IS NOT NULL AS embedded, j.result
               FROM memory_messages m JOIN memory_jobs j ON j.memory_message_id = m.id
              WHERE m.user_id = $1 ORDER BY m.id",
        )
        .bind(user)
        .fetch_all(&pool)
        .await
        .unwrap();
        assert_eq!(rows.len(), 2 * said.len(), "{user}: every message kept");
        for r in &rows {
            assert_eq!(r.state, "done", "{user}: {r:?}");
            assert!(r.embedded, "{user}: every message embedded: {r:?}");
        }
        let user_rows: Vec<&IngestRow> = rows.iter().filter(|r| r.speaker == "user").collect();
        assert_eq!(user_rows.len(), said.len());
        let failures: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM events WHERE kind = 'memory_extract_error'
               AND detail->>'user_id' = $1",
        )
        .bind(user)
        .fetch_one(&pool)
        .await
        .unwrap();
        if user == "every-call-fails" {
            // Each user message reached the model; its failure is on the job and an event.
            for r in &user_rows {
                let err = r.result.as_ref().and_then(|v| v["extract_error"].as_str());
                assert!(
                    err.is_some_and(|e| e.contains("does not fit the context")),
                    "{r:?}"
                );
            }
            assert_eq!(failures, said.len() as i64);
        } else {
            // No extractor: the lane embeds, and the failed load is one event.
            for r in &user_rows {
                assert!(
                    r.result.as_ref().unwrap().get("extracted").is_none(),
                    "{r:?}"
                );
            }
            let load_failed: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM events WHERE kind = 'memory_extract_error'
                   AND detail->>'user_id' IS NULL",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            assert_eq!(load_failed, 1);
        }
        let facts: i64 = sqlx::query_scalar("SELECT count(*) FROM memories WHERE user_id = $1")
            .bind(user)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(facts, 0, "{user}: a failed extraction stores nothing");
    }
}

#[derive(Debug, sqlx::FromRow)]
struct FactRow {
    text: String,
    entity_refs: Vec<String>,
    source_message_ids: Vec<String>,
}

/// Issue 34's subject rule through the lane on SmolLM2 (chat and extraction): what the
/// user says about themselves is stored as the user's ("User …"), what they say about
/// their sister as the sister's, never as the user's, and what the character says about
/// itself (a reply, as the turn trigger files it) is never stored at all.
#[sqlx::test(migrations = false)]
async fn a_fact_about_the_users_sister_is_hers_and_the_characters_words_are_not_the_users(
    pool: PgPool,
) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let dir = tempfile::tempdir().unwrap();
    let s = settings(serde_json::json!({"kv_dir": dir.path(), "reply_max_tokens": 16}));
    let engine = load_engine(&smollm2(), &s);
    let deps = llama_deps(&pool, s.clone(), engine.clone(), "w1");
    for said in [
        "my sister hana is a nurse in porto",
        "i teach chemistry at a secondary school",
    ] {
        let (_, log) = one_turn(&deps, "s1", "u1", ch, said).await;
        assert_eq!(log.status, "OK", "{:?}", log.error);
    }
    // A character line that states facts in the first person, filed as the trigger files
    // a reply: the lane must not read it as the user's.
    let reply_id: i64 = sqlx::query_scalar(
        "INSERT INTO memory_messages (user_id, character_id, session_id, message_id, speaker,
                                      text, at, source)
         VALUES ('u1', $1, 's1', 'turn:9999:assistant', 'assistant',
                 'I am a pilot in Lisbon and my brother Teo is a nurse.', now(), 'turn')
         RETURNING id",
    )
    .bind(ch)
    .fetch_one(&pool)
    .await
    .unwrap();
    sqlx::query("SELECT kvmem_memory_queue_ingest($1)")
        .bind(reply_id)
        .execute(&pool)
        .await
        .unwrap();

    let lane = smollm2_lane(&pool, &s);
    kvmem::memory::ingest::jobs::drain(&lane).await.unwrap();
    let facts: Vec<FactRow> = sqlx::query_as(
        "SELECT text, entity_refs, source_message_ids FROM kvmem_memories WHERE user_id = 'u1'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    // The rule lines alone state "hana is user's sister" and "hana is a nurse in porto".
    let nurse: Vec<&FactRow> = facts.iter().filter(|f| f.text.contains("nurse")).collect();
    assert!(
        !nurse.is_empty(),
        "the sister's job was not kept: {facts:?}"
    );
    for f in &facts {
        assert!(
            f.source_message_ids.iter().all(|m| m.ends_with(":user")),
            "a fact from the character's words: {f:?}"
        );
        let lower = f.text.to_lowercase();
        for invented in ["pilot", "lisbon", "teo"] {
            assert!(!lower.contains(invented), "the character's words: {f:?}");
        }
    }
    // The user's own fact is the user's: filed under no one else.
    let chemistry: Vec<&FactRow> = facts
        .iter()
        .filter(|f| f.text.contains("chemistry"))
        .collect();
    assert!(
        !chemistry.is_empty(),
        "the user's own fact was not kept: {facts:?}"
    );
    for f in chemistry {
        assert!(f.text.starts_with("User "), "{f:?}");
        assert!(f.entity_refs.is_empty(), "{f:?}");
    }
    for f in nurse {
        assert!(
            f.text.to_lowercase().starts_with("hana"),
            "the nurse is the sister, not the user: {f:?}"
        );
        assert!(f.entity_refs.contains(&"person:hana".to_string()), "{f:?}");
    }
}
