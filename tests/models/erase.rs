//! Erasing a user (issue 57): two users filled through every interface (SQL turns,
//! streamed HTTP turns, import, remember, todos, facts, summaries and extraction on
//! SmolLM2, snapshots in an S3 bucket with local copies and quarantined ones), one of them
//! erased over HTTP while a turn of theirs is stopped mid-stream on a real `kvmem worker`.
//! Then every table in the catalog (read from information_schema, so a table added later is
//! covered) holds nothing of the erased user and the other user's rows are unchanged; the
//! snapshot directory, its quarantine and the bucket hold nothing of the erased user; and
//! the turn in flight wrote nothing once it went on.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::fencing::{read, signal, terminate, until, wait_stopped, worker_command};
use common::*;
use kvmem::system::Model;
use serde_json::{json, Value};
use sqlx::PgPool;

const GONE: &str = "u-erase-gone";
const KEPT: &str = "u-erase-kept";
/// Words only each user says: whatever is derived from their messages (a summary, a
/// memory, a lexicon term) is found by them, stemmed or not.
const GONE_WORD: &str = "quetzalpine";
const KEPT_WORD: &str = "marmoraxle";

fn secret(user: &str) -> &'static str {
    if user == GONE {
        GONE_WORD
    } else {
        KEPT_WORD
    }
}

/// What identifies a user's rows: their id (every session and message id of the test
/// carries it), their word's stem, their turn and character ids.
struct Identity {
    user: &'static str,
    turns: BTreeSet<i64>,
    characters: BTreeSet<i64>,
}

impl Identity {
    async fn of(pool: &PgPool, user: &'static str) -> Identity {
        let turns: Vec<i64> = sqlx::query_scalar("SELECT id FROM turns WHERE user_id = $1")
            .bind(user)
            .fetch_all(pool)
            .await
            .unwrap();
        let characters: Vec<i64> =
            sqlx::query_scalar("SELECT id FROM user_characters WHERE user_id = $1")
                .bind(user)
                .fetch_all(pool)
                .await
                .unwrap();
        Identity {
            user,
            turns: turns.into_iter().collect(),
            characters: characters.into_iter().collect(),
        }
    }

    /// Whether a row (as JSON) is this user's, by any column.
    fn owns(&self, table: &str, row: &Value) -> bool {
        let text = row.to_string().to_lowercase();
        if text.contains(self.user) || text.contains(&secret(self.user)[..8]) {
            return true;
        }
        let Value::Object(columns) = row else {
            return false;
        };
        columns.iter().any(|(name, v)| {
            let ids = |v: &Value| -> Vec<i64> {
                match v {
                    Value::Array(a) => a.iter().filter_map(Value::as_i64).collect(),
                    v => v.as_i64().into_iter().collect(),
                }
            };
            (name.ends_with("turn_id") && ids(v).iter().any(|i| self.turns.contains(i)))
                || (name == "character_id" && ids(v).iter().any(|i| self.characters.contains(i)))
                || (table == "user_characters"
                    && name == "id"
                    && ids(v).iter().any(|i| self.characters.contains(i)))
        })
    }
}

/// Every row of every base table of the schema, as JSON text, by table.
pub(super) async fn catalog(pool: &PgPool) -> BTreeMap<String, Vec<Value>> {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables
          WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'
          ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut out = BTreeMap::new();
    for t in tables {
        let rows: Vec<Value> = sqlx::query_scalar(&format!(
            "SELECT to_jsonb(t) FROM {} t ORDER BY to_jsonb(t)::text",
            quote(&t)
        ))
        .fetch_all(pool)
        .await
        .unwrap();
        out.insert(t, rows);
    }
    out
}

fn quote(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// The rows `who` owns, by table.
fn owned(catalog: &BTreeMap<String, Vec<Value>>, who: &Identity) -> BTreeMap<String, Vec<Value>> {
    catalog
        .iter()
        .map(|(t, rows)| {
            let mine: Vec<Value> = rows.iter().filter(|r| who.owns(t, r)).cloned().collect();
            (t.clone(), mine)
        })
        .filter(|(_, rows)| !rows.is_empty())
        .collect()
}

/// Snapshot files and quarantined copies in `dir` whose scope is one of `scopes`.
fn local_files(dir: &Path, scopes: &BTreeSet<String>) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| scopes.iter().any(|s| n.starts_with(s.as_str())))
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}

async fn scopes_of(pool: &PgPool, user: &str) -> BTreeSet<String> {
    let rows: Vec<(String, i64, String)> = sqlx::query_as(
        "SELECT DISTINCT user_id, character_id, session_id FROM turns WHERE user_id = $1",
    )
    .bind(user)
    .fetch_all(pool)
    .await
    .unwrap();
    rows.iter()
        .map(|(u, c, s)| kvmem::snapshot::scope_key(u, *c, s))
        .collect()
}

async fn sql_turn(pool: &PgPool, user: &str, session: &str, ch: i64, text: &str) -> i64 {
    sqlx::query_scalar("SELECT kvmem_enqueue_turn($1, $2, $3, $4)")
        .bind(session)
        .bind(user)
        .bind(ch)
        .bind(text)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn streamed_turn(base: &str, user: &str, session: &str, ch: i64, text: &str) -> String {
    let body = json!({"session_id": session, "user": user, "character_id": ch, "stream": true,
                      "messages": [{"role": "user", "content": text}]});
    let res = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let text = res.text().await.unwrap();
    assert_eq!(sse_events(&text).last().unwrap().1, "[DONE]", "{text}");
    sse_content(&sse_chunks(&sse_events(&text)))
}

/// Whether every queued lane job and turn is done (the lanes run in the worker's idle time).
pub(super) async fn quiet(pool: &PgPool) -> bool {
    sqlx::query_scalar(
        "SELECT NOT EXISTS (SELECT 1 FROM turns WHERE state IN ('queued', 'running'))
            AND NOT EXISTS (SELECT 1 FROM memory_jobs WHERE state IN ('queued', 'running'))
            AND NOT EXISTS (SELECT 1 FROM summary_jobs
                             WHERE state IN ('queued', 'running') AND run_at <= now())",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// One user's data through every interface, with a worker on SmolLM2 serving them.
async fn fill(pool: &PgPool, base: &str, user: &str, chars: &[i64], import: &Path) {
    let word = secret(user);
    let s1 = format!("{user}-s1");
    let s2 = format!("{user}-s2");
    fact(pool, &s1, "location", "base", &format!("the {word} hangar")).await;
    for text in [
        format!("Remember that my locker code is {word} 4411."),
        format!("I need to renew the {word} permit by Friday."),
        format!("My sister Ana grows {word} roses in Porto."),
        format!("Tell me about the {word} garden again."),
    ] {
        sql_turn(pool, user, &s1, chars[0], &text).await;
    }
    until("the SQL turns", Duration::from_secs(300), || quiet(pool)).await;
    let ch = *chars.last().unwrap();
    streamed_turn(base, user, &s2, ch, &format!("What is {word}?")).await;
    let lines: Vec<String> = (0..3)
        .map(|i| {
            json!({"user_id": user, "session_id": format!("{user}-imp"),
                   "message_id": format!("{user}-m{i}"), "speaker": if i % 2 == 0 { "Ann" } else { "Bo" },
                   "text": format!("The {word} festival starts on day {i}."),
                   "at": format!("2026-05-0{}T10:00:00Z", i + 1)})
            .to_string()
        })
        .collect();
    std::fs::write(import, lines.join("\n")).unwrap();
    let url = db_url(pool).await;
    let out = kvmem_command(&url)
        .args(["memory", "import", "--extract", "none", "--file"])
        .arg(import)
        .output()
        .unwrap();
    assert_success(&out);
    // The summary session closes once idle (2 s here, see the test), and the lane
    // summarises it: a real-time wait for real-time behaviour.
    until("a session summary", Duration::from_secs(600), || async {
        let n: i64 =
            sqlx::query_scalar("SELECT count(*) FROM session_summaries WHERE user_id = $1")
                .bind(user)
                .fetch_one(pool)
                .await
                .unwrap();
        n > 0
    })
    .await;
    until("the lanes", Duration::from_secs(600), || quiet(pool)).await;
}

#[sqlx::test(migrations = false)]
async fn an_erased_user_is_gone_from_every_table_and_store_and_the_other_is_untouched(
    pool: PgPool,
) {
    migrate(&pool).await;
    sqlx::query(
        "INSERT INTO kvmem_config (key, value) VALUES ('summary_session_idle_s', '2')
         ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
    )
    .execute(&pool)
    .await
    .unwrap();
    let work = tempfile::tempdir().unwrap();
    let kv = work.path().join("kv");
    let (bucket_name, bucket) = bucket("erase").await;
    let s3 = json!({"kv_dir": kv, "snapshot_store": "s3", "s3_endpoint": endpoint(),
                    "s3_bucket": bucket_name, "s3_access_key_id": "test",
                    "s3_secret_access_key": "test", "s3_timeout_ms": 5000});
    let mut overrides = json!({"n_ctx": 2048, "kv_tail_tokens": 1024, "reply_max_tokens": 24,
                               "memory_extract": true});
    overrides
        .as_object_mut()
        .unwrap()
        .extend(s3.as_object().unwrap().clone());
    let settings = common::settings(overrides);
    let gone = [
        character(&pool, GONE, "Vera").await,
        character(&pool, GONE, "Quill").await,
    ];
    let kept = [character(&pool, KEPT, "Moss").await];

    // Everything, with a worker on SmolLM2 in the server as `kvmem serve` runs it.
    let engine = load_engine(&smollm2(), &settings);
    let deps = common::deps(&pool, settings.clone(), Model::Llama(engine), "w-fill");
    let store = deps.snapshots.clone().unwrap();
    let state =
        crate::common::http_state(pool.clone(), Arc::new(settings.clone()), "ab".repeat(32))
            .with_snapshots(store);
    let served = serve(state, Some(deps)).await;
    for (user, chars) in [(GONE, &gone[..]), (KEPT, &kept[..])] {
        fill(
            &pool,
            &served.base,
            user,
            chars,
            &work.path().join(format!("{user}.jsonl")),
        )
        .await;
    }
    drop(served);
    // The fill reached every layer: the test's "nothing left" below is not vacuous.
    let filled = owned(&catalog(&pool).await, &Identity::of(&pool, GONE).await);
    for table in [
        "turns",
        "messages",
        "turn_log",
        "events",
        "memories",
        "memory_messages",
        "memory_jobs",
        "todos",
        "facts",
        "state_digest",
        "session_kv",
        "session_locks",
        "memory_lexicon",
        "session_summaries",
        "summary_sessions",
        "summary_jobs",
        "user_characters",
    ] {
        assert!(
            filled.contains_key(table),
            "the fill left no {table} row of {GONE}: {:?}",
            filled.keys()
        );
    }

    // A quarantined copy: the session's cached snapshot is damaged, the next load moves it aside.
    let scopes = scopes_of(&pool, GONE).await;
    let cached = local_files(&kv, &scopes);
    assert!(!cached.is_empty(), "no local snapshot of {GONE}");
    let victim = kv.join(&cached[0]);
    let mut bytes = std::fs::read(&victim).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&victim, bytes).unwrap();

    // A turn of the user in flight: a real worker stopped mid-stream.
    let url = db_url(&pool).await;
    let log = work.path().join("worker.log");
    let mut cmd = worker_command(&url, &kv, Some("mid_stream"), &log);
    cmd.env("KVMEM_MODEL_PATH", smollm2())
        .env("N_CTX", "2048")
        .env("KV_TAIL_TOKENS", "1024")
        .env("REPLY_MAX_TOKENS", "48")
        .env("KVMEM_SNAPSHOT_STORE", "s3")
        .env("KVMEM_S3_ENDPOINT", endpoint())
        .env("KVMEM_S3_BUCKET", &bucket_name)
        .env("KVMEM_S3_ACCESS_KEY_ID", "test")
        .env("KVMEM_S3_SECRET_ACCESS_KEY", "test")
        .env("KVMEM_MEMORY_LANE", "false")
        .env("KVMEM_SUMMARY_LANE", "false");
    let mut worker = cmd.spawn().expect("spawn kvmem worker");
    let session = format!("{GONE}-s1");
    let inflight = sql_turn(
        &pool,
        GONE,
        &session,
        gone[0],
        "Describe the outpost we found.",
    )
    .await;
    wait_stopped(&mut worker, &log).await;
    let quarantined = local_files(&kv, &scopes)
        .into_iter()
        .filter(|n| n.ends_with(".bad"))
        .count();
    assert!(
        quarantined > 0,
        "the damaged snapshot was quarantined: {}",
        read(&log)
    );
    let objects_before: Vec<String> = keys(&bucket).await;
    assert!(
        objects_before
            .iter()
            .any(|k| scopes.iter().any(|s| k.contains(s.as_str()))),
        "the bucket holds {GONE}'s snapshots"
    );

    let before = catalog(&pool).await;
    let gone_id = Identity::of(&pool, GONE).await;
    let kept_id = Identity::of(&pool, KEPT).await;
    assert!(gone_id.turns.contains(&inflight));
    let kept_before = owned(&before, &kept_id);
    assert!(
        kept_before.len() >= 10,
        "the other user's rows: {:?}",
        kept_before.keys()
    );

    // The erase, over HTTP. First the wall: the other user cannot reach these.
    let state =
        crate::common::http_state(pool.clone(), Arc::new(settings.clone()), "ab".repeat(32))
            .with_snapshots(
                kvmem::system::snapshot_store(&settings, &kvmem::metrics::Metrics::new()).unwrap(),
            );
    let api = serve(state, None).await;
    let client = reqwest::Client::new();
    let erase = |body: Value| {
        client
            .post(format!("{}/v1/erase", api.base))
            .json(&body)
            .send()
    };
    for body in [
        json!({"user": KEPT, "character_id": gone[0]}),
        json!({"user": KEPT, "session_id": session}),
    ] {
        let res = erase(body.clone()).await.unwrap();
        assert_eq!(res.status(), 404, "{body}");
    }
    assert_eq!(
        catalog(&pool).await,
        before,
        "a refused erase changed nothing"
    );

    let res = erase(json!({"user": GONE})).await.unwrap();
    assert_eq!(res.status(), 200);
    let done: Value = res.json().await.unwrap();
    let tables = &done["tables"];
    assert!(
        tables["turns"].as_i64().unwrap() >= gone_id.turns.len() as i64,
        "{done}"
    );
    assert!(
        tables["turn_stream_deltas"].as_i64().unwrap() > 0,
        "the in-flight turn's deltas: {done}"
    );
    assert!(done["stores"]["files"].as_u64().unwrap() > 0, "{done}");
    assert!(
        done["stores"]["quarantined"].as_u64().unwrap() > 0,
        "{done}"
    );
    assert!(done["stores"]["objects"].as_u64().unwrap() > 0, "{done}");

    // The turn goes on, finds its lease gone, and ends.
    signal(&worker, libc::SIGCONT);
    until(
        "the worker to give the turn up",
        Duration::from_secs(120),
        || async { read(&log).contains("lease lost") },
    )
    .await;
    terminate(worker).await;

    let after = catalog(&pool).await;
    let left = owned(&after, &gone_id);
    assert!(left.is_empty(), "rows of the erased user remain: {left:#?}");
    let mut kept_after = owned(&after, &kept_id);
    let mut kept_before = kept_before;
    // Reply deltas are trimmed by age (a worker's reaper ran meanwhile); none is added.
    let (deltas_before, deltas_after) = (
        kept_before.remove("turn_stream_deltas").unwrap_or_default(),
        kept_after.remove("turn_stream_deltas").unwrap_or_default(),
    );
    assert!(deltas_after.iter().all(|d| deltas_before.contains(d)));
    assert_eq!(kept_after, kept_before, "the other user's rows changed");
    assert!(
        local_files(&kv, &scopes).is_empty(),
        "local files: {:?}",
        local_files(&kv, &scopes)
    );
    let objects: Vec<String> = keys(&bucket)
        .await
        .into_iter()
        .filter(|k| scopes.iter().any(|s| k.contains(s.as_str())))
        .collect();
    assert!(objects.is_empty(), "objects left: {objects:?}");
    assert!(
        !keys(&bucket).await.is_empty() && !scopes_of(&pool, KEPT).await.is_empty(),
        "the other user's snapshots stay"
    );

    // Again: nothing more to remove, and each erase left one audit event without content.
    let res = erase(json!({"user": GONE})).await.unwrap();
    let again: Value = res.json().await.unwrap();
    assert!(
        again["tables"]
            .as_object()
            .unwrap()
            .values()
            .all(|n| n == 0),
        "{again}"
    );
    assert_eq!(again["stores"]["files"], 0);
    let audits: Vec<Value> =
        sqlx::query_scalar("SELECT detail FROM events WHERE kind = 'erased' ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(audits.len(), 2);
    assert_eq!(audits[0]["subject"], done["subject"]);
    assert!(!audits[0].to_string().contains(GONE));
    drop(api);
}
