//! Erasing one character or one session (issue 57) leaves the rest of its user and every
//! other user exactly as they were, through SQL and `kvmem erase`; the SQL function's scope
//! keys are the snapshot files' own. Turns run on the echo generator (queue mechanics);
//! the snapshot files are real LLKV1 files written by the snapshot store.

use crate::common;

use common::*;
use kvmem::snapshot::{self, Header, SnapshotStore};
use serde_json::Value;
use sqlx::PgPool;

const U: &str = "u-erase-part";
const V: &str = "u-erase-other";

#[sqlx::test(migrations = false)]
async fn the_sql_scope_key_is_the_snapshot_files_scope_key(pool: PgPool) {
    migrate(&pool).await;
    let long = "s".repeat(300);
    for (u, c, s) in [
        ("u1", 1, "s"),
        ("u11", 2, "s"),
        ("ünï", 123_456_789_012, "sess-é"),
        ("", 0, long.as_str()),
    ] {
        let sql: String = sqlx::query_scalar("SELECT kvmem_scope_key($1, $2, $3)")
            .bind(u)
            .bind(c)
            .bind(s)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(sql, snapshot::scope_key(u, c, s), "{u} {c} {s}");
    }
}

/// A real snapshot file for a session, as a worker would have saved it.
async fn snapshot_file(store: &SnapshotStore, user: &str, ch: i64, session: &str) -> String {
    let scope = snapshot::scope_key(user, ch, session);
    let mut header = Header::new(&"ab".repeat(32), "test", &scope);
    let file = snapshot::encode(&mut header, &[1, 2, 3], &[7u8; 64]).unwrap();
    store.save(&scope, file, |_| {}).await.unwrap();
    scope
}

async fn rows(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// The BM25 statistics of `user` as stored, and as counted afresh from the dialogue rows.
async fn lexicon(pool: &PgPool, user: &str) -> (Vec<(String, i32)>, Vec<(String, i32)>) {
    let stored = sqlx::query_as(
        "SELECT term, df FROM memory_lexicon WHERE user_id = $1 AND df > 0 ORDER BY term",
    )
    .bind(user)
    .fetch_all(pool)
    .await
    .unwrap();
    let counted = sqlx::query_as(
        "SELECT u.lexeme, count(*)::int FROM memory_messages m, unnest(m.tsv) u
          WHERE m.user_id = $1 AND 'A' = ANY(u.weights) GROUP BY 1 ORDER BY 1",
    )
    .bind(user)
    .fetch_all(pool)
    .await
    .unwrap();
    (stored, counted)
}

#[sqlx::test(migrations = false)]
async fn erasing_a_character_or_a_session_leaves_the_rest_of_the_user_and_others(pool: PgPool) {
    migrate(&pool).await;
    let (a, b) = (
        character(&pool, U, "Ada").await,
        character(&pool, U, "Bo").await,
    );
    let c = character(&pool, V, "Cy").await;
    for (user, ch, session, text) in [
        (U, a, "pa-1", "the amber lighthouse"),
        (U, a, "pa-2", "the amber harbour"),
        (U, b, "pb-1", "the basalt quarry"),
        (U, b, "pb-2", "the basalt bridge"),
        (V, c, "pc-1", "the amber lighthouse"),
    ] {
        kvmem::queue::enqueue(&pool, session, user, ch, text, None)
            .await
            .unwrap();
    }
    let deps = echo_deps(&pool, settings(serde_json::json!({})), "w-erase");
    drain(&deps).await;
    let dir = tempfile::tempdir().unwrap();
    let store = kvmem::system::snapshot_store(
        &settings(serde_json::json!({"kv_dir": dir.path()})),
        &kvmem::metrics::Metrics::new(),
    )
    .unwrap();
    let scope_a = snapshot_file(&store, U, a, "pa-1").await;
    let scope_b = snapshot_file(&store, U, b, "pb-1").await;
    store
        .quarantine(&scope_a)
        .await
        .expect("a quarantined copy");
    snapshot_file(&store, U, a, "pa-1").await;
    assert!(rows(&pool, "SELECT count(*) FROM memory_messages").await >= 10);

    // One character, from the shell.
    let url = db_url(&pool).await;
    let out = kvmem_command(&url)
        .env("KVMEM_KV_DIR", dir.path())
        .args(["erase", "--json", "--character", &a.to_string()])
        .output()
        .unwrap();
    assert_success(&out);
    let done: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(done["kind"], "character");
    assert_eq!(done["tables"]["turns"], 2);
    assert_eq!(done["tables"]["messages"], 4);
    assert_eq!(done["tables"]["user_characters"], 1);
    assert_eq!(done["stores"]["files"], 1);
    assert_eq!(done["stores"]["quarantined"], 1);
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.starts_with(&scope_a)), "{names:?}");
    assert!(names.iter().any(|n| n.starts_with(&scope_b)), "{names:?}");
    for (sql, expect) in [
        (
            format!("SELECT count(*) FROM turns WHERE character_id = {a}"),
            0,
        ),
        (
            "SELECT count(*) FROM messages WHERE session_id LIKE 'pa-%'".into(),
            0,
        ),
        (
            "SELECT count(*) FROM memory_messages WHERE session_id LIKE 'pa-%'".into(),
            0,
        ),
        (
            "SELECT count(*) FROM session_locks WHERE session_id LIKE 'pa-%'".into(),
            0,
        ),
        (
            format!("SELECT count(*) FROM turns WHERE character_id = {b}"),
            2,
        ),
        (
            "SELECT count(*) FROM messages WHERE session_id LIKE 'pb-%'".into(),
            4,
        ),
        (
            "SELECT count(*) FROM messages WHERE session_id = 'pc-1'".into(),
            2,
        ),
        (
            "SELECT count(*) FROM memory_messages WHERE user_id = 'u-erase-other'".into(),
            2,
        ),
    ] {
        assert_eq!(rows(&pool, &sql).await, expect, "{sql}");
    }
    // The statistics forget the erased words: "harbour" was only in character a's session.
    let (stored, counted) = lexicon(&pool, U).await;
    assert_eq!(stored, counted);
    assert!(stored
        .iter()
        .all(|(t, _)| t != "harbour" && t != "lighthous"));
    let (stored_v, counted_v) = lexicon(&pool, V).await;
    assert_eq!(stored_v, counted_v);
    assert!(stored_v.iter().any(|(t, _)| t == "lighthous"));

    // One session, in SQL; refused when named with a user who is not its only one.
    let refused = sqlx::query("SELECT kvmem_erase_session('pb-1', $1)")
        .bind(V)
        .execute(&pool)
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("is not only user"),
        "{refused}"
    );
    let erased: Value = sqlx::query_scalar("SELECT kvmem_erase_session('pb-1', $1)")
        .bind(U)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(erased["tables"]["turns"], 1);
    assert_eq!(erased["scopes"][0], scope_b);
    assert_eq!(
        rows(
            &pool,
            "SELECT count(*) FROM turns WHERE session_id = 'pb-2'"
        )
        .await,
        1
    );
    assert_eq!(
        rows(
            &pool,
            &format!("SELECT count(*) FROM user_characters WHERE id = {b}")
        )
        .await,
        1
    );
    let again: Value = sqlx::query_scalar("SELECT kvmem_erase_session('pb-1')")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(again["tables"]
        .as_object()
        .unwrap()
        .values()
        .all(|n| n == 0));
    let empty = sqlx::query("SELECT kvmem_erase_user('  ')")
        .execute(&pool)
        .await
        .unwrap_err();
    assert!(empty.to_string().contains("user_id is empty"), "{empty}");
    assert_eq!(
        rows(
            &pool,
            "SELECT count(*) FROM events WHERE kind = 'erased' AND detail::text LIKE '%u-erase%'"
        )
        .await,
        0,
        "audit events name no one"
    );
    assert_eq!(
        rows(&pool, "SELECT count(*) FROM events WHERE kind = 'erased'").await,
        3
    );
}
