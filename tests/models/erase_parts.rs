//! Erasing one session, then one character, leaves nothing of either: one user filled on
//! SmolLM2 through every interface (a chat over HTTP found by its history, with an in-chat
//! "remember that …", a second message, a regenerate and an edit; SQL turns; a streamed
//! turn; an import; facts; todos; extraction; summaries from the summary lane; snapshots in
//! an S3 bucket). After each erase every base table of the catalog (from
//! information_schema) holds no row naming the subject's sessions, turns or character, or a
//! word only the subject said; the rows of the rest are unchanged but for what is derived
//! across the user (summaries, statistics, the rendered blob), which is rebuilt; and the
//! bucket holds none of the subject's snapshots.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use super::erase::{catalog, quiet};
use super::fencing::until;
use common::*;
use kvmem::system::Model;
use serde_json::{json, Value};
use sqlx::PgPool;

const USER: &str = "u-parts";
/// Words only each subject says (and only their first eight letters are looked for, so a
/// stem or a lexicon term counts too).
const SESSION_WORD: &str = "plumzarnok";
const CHAR_WORD: &str = "vellichor";
const KEPT_WORD: &str = "brindlemoss";

/// Tables whose rows are derived across the user and rebuilt after a part of it is erased;
/// the erase's own audit event and scope list are new rows, and reply deltas are trimmed by
/// age meanwhile.
const DERIVED: &[&str] = &[
    "rolling_summaries",
    "session_summaries",
    "summary_sessions",
    "summary_jobs",
    "session_state",
    "summary_spine",
    "historical_summaries",
    "user_contexts",
    "daily_summaries",
    "memory_lexicon",
    "memory_lexicon_users",
    "memory_speakers",
    "memory_blobs",
    "memory_entity_aliases",
    "events",
    "erased_scopes",
    "turn_stream_deltas",
    "memory_jobs",
];

/// What names a subject: its words, sessions, turns, and (a character) its id.
struct Subject {
    word: &'static str,
    sessions: BTreeSet<String>,
    turns: BTreeSet<i64>,
    character: Option<i64>,
}

impl Subject {
    fn names(&self, table: &str, row: &Value) -> bool {
        let text = row.to_string().to_lowercase();
        if text.contains(&self.word[..8]) || self.sessions.iter().any(|s| text.contains(s.as_str()))
        {
            return true;
        }
        let Value::Object(columns) = row else {
            return false;
        };
        let ids = |v: &Value| -> Vec<i64> {
            match v {
                Value::Array(a) => a.iter().filter_map(Value::as_i64).collect(),
                v => v.as_i64().into_iter().collect(),
            }
        };
        let keys = |v: &Value| -> Vec<String> {
            match v {
                Value::Array(a) => a
                    .iter()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect(),
                _ => Vec::new(),
            }
        };
        columns.iter().any(|(name, v)| {
            (name.ends_with("turn_id") && ids(v).iter().any(|i| self.turns.contains(i)))
                || (name == "source_message_ids"
                    && keys(v).iter().any(|k| {
                        self.turns
                            .iter()
                            .any(|t| k.starts_with(&format!("turn:{t}:")))
                    }))
                || (self.character.is_some()
                    && (name == "character_id" || (table == "user_characters" && name == "id"))
                    && ids(v).contains(&self.character.unwrap()))
        })
    }
}

fn named(catalog: &BTreeMap<String, Vec<Value>>, s: &Subject) -> BTreeMap<String, Vec<Value>> {
    catalog
        .iter()
        .map(|(t, rows)| {
            (
                t.clone(),
                rows.iter()
                    .filter(|r| s.names(t, r))
                    .cloned()
                    .collect::<Vec<_>>(),
            )
        })
        .filter(|(_, rows)| !rows.is_empty())
        .collect()
}

/// The catalog less the subject's rows and the derived tables.
fn rest(catalog: &BTreeMap<String, Vec<Value>>, s: &Subject) -> BTreeMap<String, Vec<Value>> {
    catalog
        .iter()
        .filter(|(t, _)| !DERIVED.contains(&t.as_str()))
        .map(|(t, rows)| {
            (
                t.clone(),
                rows.iter().filter(|r| !s.names(t, r)).cloned().collect(),
            )
        })
        .collect()
}

async fn chat(base: &str, ch: i64, messages: Value) -> (String, String) {
    let r = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({"user": USER, "character_id": ch, "messages": messages}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let session = r.headers()["x-kvmem-session"].to_str().unwrap().to_string();
    let body: Value = r.json().await.unwrap();
    (
        session,
        body["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string(),
    )
}

async fn sql_turn(pool: &PgPool, session: &str, ch: i64, text: &str) {
    sqlx::query("SELECT kvmem_enqueue_turn($1, $2, $3, $4)")
        .bind(session)
        .bind(USER)
        .bind(ch)
        .bind(text)
        .execute(pool)
        .await
        .unwrap();
}

async fn turns_of(pool: &PgPool, sessions: &BTreeSet<String>) -> BTreeSet<i64> {
    let v: Vec<String> = sessions.iter().cloned().collect();
    let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM turns WHERE session_id = ANY($1)")
        .bind(&v)
        .fetch_all(pool)
        .await
        .unwrap();
    ids.into_iter().collect()
}

#[sqlx::test(migrations = false)]
async fn an_erased_session_and_an_erased_character_leave_nothing_of_theirs(pool: PgPool) {
    migrate(&pool).await;
    sqlx::query(
        "INSERT INTO kvmem_config (key, value) VALUES ('summary_session_idle_s', '2')
         ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
    )
    .execute(&pool)
    .await
    .unwrap();
    let work = tempfile::tempdir().unwrap();
    let (bucket_name, bucket) = bucket("erase-parts").await;
    let settings = common::settings(json!({
        "n_ctx": 2048, "kv_tail_tokens": 1024, "reply_max_tokens": 16, "memory_extract": true,
        "kv_dir": work.path().join("kv"), "snapshot_store": "s3", "s3_endpoint": endpoint(),
        "s3_bucket": bucket_name, "s3_access_key_id": "test", "s3_secret_access_key": "test",
        "s3_timeout_ms": 5000}));
    let (c1, c2) = (
        character(&pool, USER, "Vera").await,
        character(&pool, USER, "Quill").await,
    );
    let engine = load_engine(&smollm2(), &settings);
    let deps = common::deps(&pool, settings.clone(), Model::Llama(engine), "w-parts");
    let store = deps.snapshots.clone().unwrap();
    let state =
        crate::common::http_state(pool.clone(), Arc::new(settings.clone()), "ab".repeat(32))
            .with_snapshots(store);
    let served = serve(state, Some(deps)).await;
    let base = served.base.clone();

    // The session to erase: a chat a front-end sends whole each time.
    let u1 =
        format!("Remember that my locker code is 4417 and my plum tree is called {SESSION_WORD}.");
    let u2 = format!("I need to water the {SESSION_WORD} tree by Friday.");
    let (gone, a1) = chat(&base, c1, json!([{"role": "user", "content": u1}])).await;
    let history = json!([{"role": "user", "content": u1}, {"role": "assistant", "content": a1},
                         {"role": "user", "content": u2}]);
    let (again, _) = chat(&base, c1, history.clone()).await;
    assert_eq!(again, gone, "the second message continues the session");
    let (regenerated, _) = chat(&base, c1, history).await;
    let edited = json!([{"role": "user", "content": u1}, {"role": "assistant", "content": a1},
                        {"role": "user", "content": format!("Actually the {SESSION_WORD} tree is fine.")}]);
    let (edit, _) = chat(&base, c1, edited).await;
    assert!(
        regenerated != gone && edit != gone,
        "a regenerate and an edit branch"
    );
    fact(
        &pool,
        &gone,
        "location",
        "tree",
        &format!("the {SESSION_WORD} orchard"),
    )
    .await;

    // The rest of the user: another session with the same character, the other character.
    for text in [
        format!("The {KEPT_WORD} path is muddy."),
        format!("Tell me about the {KEPT_WORD} path."),
    ] {
        sql_turn(&pool, "parts-kept", c1, &text).await;
    }
    for text in [
        format!("My brother Tom builds {CHAR_WORD} boats."),
        format!("I must call Tom about the {CHAR_WORD} race by Monday."),
    ] {
        sql_turn(&pool, "parts-char", c2, &text).await;
    }
    until("the turns and lanes", Duration::from_secs(600), || {
        quiet(&pool)
    })
    .await;
    let streamed = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({"session_id": "parts-char-2", "user": USER, "character_id": c2, "stream": true,
                      "messages": [{"role": "user", "content": format!("Is the {CHAR_WORD} race on?")}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(streamed.status(), 200);
    streamed.text().await.unwrap();
    let import = work.path().join("import.jsonl");
    std::fs::write(&import, json!({"user_id": USER, "session_id": "parts-imp", "message_id": "pi-1",
        "speaker": "Ann", "text": format!("The {KEPT_WORD} fair opens soon."), "at": "2026-05-01T10:00:00Z"}).to_string()).unwrap();
    let out = kvmem_command(&db_url(&pool).await)
        .args(["memory", "import", "--extract", "none", "--file"])
        .arg(&import)
        .output()
        .unwrap();
    assert_success(&out);
    until("a session summary", Duration::from_secs(600), || async {
        let n: i64 =
            sqlx::query_scalar("SELECT count(*) FROM session_summaries WHERE user_id = $1")
                .bind(USER)
                .fetch_one(&pool)
                .await
                .unwrap();
        n > 0
    })
    .await;
    until("the lanes", Duration::from_secs(600), || quiet(&pool)).await;
    drop(served);

    let sessions: BTreeSet<String> = [gone.clone(), regenerated, edit].into_iter().collect();
    let session = Subject {
        word: SESSION_WORD,
        turns: turns_of(&pool, &sessions).await,
        sessions,
        character: None,
    };
    let before = catalog(&pool).await;
    let filled = named(&before, &session);
    for table in [
        "turns",
        "messages",
        "memories",
        "memory_messages",
        "facts",
        "session_kv",
    ] {
        assert!(
            filled.contains_key(table),
            "the fill left no {table} row of the session: {:?}",
            filled.keys()
        );
    }
    let remembered: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM memories WHERE user_id = $1 AND text LIKE '%4417%'",
    )
    .bind(USER)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(remembered > 0, "the in-chat remember was stored");
    let objects = |scopes: Vec<String>| {
        let bucket = bucket.clone();
        async move {
            keys(&bucket)
                .await
                .into_iter()
                .filter(|k| scopes.iter().any(|s| k.contains(s.as_str())))
                .count()
        }
    };
    let scopes_of = |rows: Vec<(String, i64, String)>| -> Vec<String> {
        rows.iter()
            .map(|(u, c, s)| kvmem::snapshot::scope_key(u, *c, s))
            .collect()
    };
    let session_scopes = scopes_of(
        session
            .sessions
            .iter()
            .map(|s| (USER.to_string(), c1, s.clone()))
            .collect(),
    );
    assert!(
        objects(session_scopes.clone()).await > 0,
        "the bucket holds the session's snapshots"
    );

    // The session, with its branches, over HTTP.
    let store = kvmem::system::snapshot_store(&settings, &kvmem::metrics::Metrics::new()).unwrap();
    let state =
        crate::common::http_state(pool.clone(), Arc::new(settings.clone()), "ab".repeat(32))
            .with_snapshots(store);
    let api = serve(state, None).await;
    let r = reqwest::Client::new()
        .post(format!("{}/v1/erase", api.base))
        .json(&json!({"user": USER, "session_id": gone}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let after = catalog(&pool).await;
    let left = named(&after, &session);
    assert!(
        left.is_empty(),
        "rows of the erased session remain: {left:#?}"
    );
    assert_eq!(
        rest(&after, &session),
        rest(&before, &session),
        "the rest of the user changed"
    );
    assert_eq!(
        objects(session_scopes).await,
        0,
        "the session's snapshots are gone"
    );

    // Then the other character, from the shell.
    let char_sessions: BTreeSet<String> =
        ["parts-char".to_string(), "parts-char-2".to_string()].into();
    let character = Subject {
        word: CHAR_WORD,
        turns: turns_of(&pool, &char_sessions).await,
        sessions: char_sessions.clone(),
        character: Some(c2),
    };
    let before = after;
    let filled = named(&before, &character);
    for table in ["turns", "memory_messages", "user_characters", "session_kv"] {
        assert!(
            filled.contains_key(table),
            "the fill left no {table} row of the character: {:?}",
            filled.keys()
        );
    }
    let char_scopes = scopes_of(
        char_sessions
            .iter()
            .map(|s| (USER.to_string(), c2, s.clone()))
            .collect(),
    );
    let out = kvmem_command(&db_url(&pool).await)
        .env("KVMEM_KV_DIR", work.path().join("kv"))
        .env("KVMEM_SNAPSHOT_STORE", "s3")
        .env("KVMEM_S3_ENDPOINT", endpoint())
        .env("KVMEM_S3_BUCKET", &bucket_name)
        .env("KVMEM_S3_ACCESS_KEY_ID", "test")
        .env("KVMEM_S3_SECRET_ACCESS_KEY", "test")
        .args(["erase", "--character", &c2.to_string()])
        .output()
        .unwrap();
    assert_success(&out);
    let after = catalog(&pool).await;
    let left = named(&after, &character);
    assert!(
        left.is_empty(),
        "rows of the erased character remain: {left:#?}"
    );
    assert_eq!(
        rest(&after, &character),
        rest(&before, &character),
        "the rest of the user changed"
    );
    assert_eq!(
        objects(char_scopes).await,
        0,
        "the character's snapshots are gone"
    );
    let kept: i64 = sqlx::query_scalar("SELECT count(*) FROM memory_messages WHERE text LIKE $1")
        .bind(format!("%{KEPT_WORD}%"))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(kept >= 3, "the kept session and the import stay: {kept}");
    drop(api);
}
