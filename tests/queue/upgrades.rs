//! Upgrades, run as an operator runs them: the real `kvmem` binary on a schema behind it
//! (read-only commands refuse and migrate nothing), on a schema a newer release migrated
//! (fixture migrations recorded through sqlx's own bookkeeping, as that release would
//! leave them: additive ones are run on, any other makes a starting worker refuse),
//! `kvmem demo` on a database that holds turns, and every command's `--help`. The rolling
//! upgrade of a fleet under load is `chaos::upgrade`.

use crate::common;

use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use sqlx::migrate::{Migrate, Migration, MigrationType};
use sqlx::PgPool;

/// A newer release's additive migration: a column on the tables workers write most, and a
/// table of its own.
pub const ADDITIVE_FIXTURE: (&str, &str) = (
    "29991231000001_additive_upgrade_fixture.sql",
    include_str!("../fixtures/migrations/29991231000001_additive_upgrade_fixture.sql"),
);

/// A newer release's migration that is not additive: it renames a column workers read.
pub const BREAKING_FIXTURE: (&str, &str) = (
    "29991231000002_rename_turn_reply.sql",
    include_str!("../fixtures/migrations/29991231000002_rename_turn_reply.sql"),
);

/// Applies a fixture migration the way sqlx applies a release's file: its version and
/// description from the file name, its SQL run and recorded in `_sqlx_migrations` with
/// its checksum. The binary under test does not know it.
pub async fn apply_fixture(pool: &PgPool, (file, sql): (&str, &'static str)) {
    let (version, rest) = file.split_once('_').unwrap();
    let description = rest.trim_end_matches(".sql").replace('_', " ");
    let m = Migration::new(
        version.parse().unwrap(),
        description.into(),
        MigrationType::Simple,
        sql.into(),
        false,
    );
    let mut conn = pool.acquire().await.unwrap();
    conn.ensure_migrations_table().await.unwrap();
    conn.apply(&m).await.unwrap();
}

/// `_sqlx_migrations` as it stands: version, description, installed_on.
async fn recorded(pool: &PgPool) -> Vec<(i64, String, chrono::DateTime<chrono::Utc>)> {
    sqlx::query_as("SELECT version, description, installed_on FROM _sqlx_migrations ORDER BY 1")
        .fetch_all(pool)
        .await
        .unwrap()
}

fn run(url: &str, args: &[&str]) -> Output {
    kvmem_command(url).args(args).output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[sqlx::test(migrations = false)]
async fn read_only_commands_refuse_a_schema_behind_them_and_migrate_nothing(pool: PgPool) {
    // Every migration of this binary but the last, applied as sqlx applies them.
    let known: Vec<&Migration> = kvmem::db::MIGRATOR.iter().collect();
    let (last, earlier) = known.split_last().unwrap();
    {
        let mut conn = pool.acquire().await.unwrap();
        conn.ensure_migrations_table().await.unwrap();
        for m in earlier {
            conn.apply(m).await.unwrap();
        }
    }
    let before = recorded(&pool).await;
    assert_eq!(before.len(), known.len() - 1);
    let url = db_url(&pool).await;
    let commands: &[&[&str]] = &[
        &["status"],
        &["digest", "--session", "s1"],
        &["memory", "search", "--user", "u1", "--query", "ships"],
        &["memory", "show", "--user", "u1"],
        &["memory", "todos", "--user", "u1", "--character", "1"],
        &["memory", "cards", "--user", "u1"],
        &["memory", "journal", "--user", "u1", "--date", "2026-11-29"],
        &["memory", "snapshot", "--user", "u1"],
        &["memory", "entities", "--user", "u1"],
        &["summary", "show", "--user", "u1"],
        &["summary", "context", "--user", "u1"],
        &[
            "summary",
            "export",
            "--session",
            "s1",
            "--file",
            "/dev/null",
        ],
    ];
    for args in commands {
        let out = run(&url, args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "kvmem {args:?}: {err}");
        let name = args
            .iter()
            .take_while(|a| !a.starts_with("--"))
            .copied()
            .collect::<Vec<_>>()
            .join(" ");
        for needle in [
            "schema is behind this binary".to_string(),
            format!("`kvmem {name}` only reads and never migrates"),
            "run `kvmem migrate` first".to_string(),
            format!("the first {} {}", last.version, last.description),
        ] {
            assert!(
                err.contains(&needle),
                "kvmem {args:?}: {needle:?} not in {err}"
            );
        }
    }
    // The status lists the pending migration and writes nothing either.
    let out = run(&url, &["migrate", "--status"]);
    assert_success(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("pending  {}", last.version)),
        "{text}"
    );
    assert!(text.contains("behind this binary by 1 migration"), "{text}");
    assert_eq!(
        text.lines().filter(|l| l.starts_with("applied  ")).count(),
        known.len() - 1,
        "{text}"
    );
    assert_eq!(
        recorded(&pool).await,
        before,
        "a read-only command migrated"
    );
    // What was refused is the schema, not the command: migrated, the same commands run.
    assert_success(&run(&url, &["migrate"]));
    assert_eq!(recorded(&pool).await.len(), known.len());
    for args in [&["status"][..], &["summary", "show", "--user", "u1"]] {
        assert_success(&run(&url, args));
    }
}

/// Waits for a process that must exit by itself, killing it (and failing) at the deadline.
fn exit_within(mut child: std::process::Child, limit: Duration) -> Output {
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("still running after {limit:?}: {}", stderr(&out));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[sqlx::test(migrations = false)]
async fn a_worker_runs_on_newer_additive_migrations_and_refuses_any_other(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let turn = kvmem::queue::enqueue(&pool, "s1", "u1", ch, "hello", None)
        .await
        .unwrap();
    let url = db_url(&pool).await;
    // Additive only: the older binary migrates nothing, installs nothing, and runs.
    apply_fixture(&pool, ADDITIVE_FIXTURE).await;
    let out = run(&url, &["migrate"]);
    assert_success(&out);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("schema is newer than this binary (1 additive"),
        "{said}"
    );
    assert_success(&run(&url, &["status"]));
    let out = run(&url, &["migrate", "--status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("newer    29991231000001") && text.contains("(additive)"),
        "{text}"
    );
    assert!(
        text.contains("newer than this binary by 1 additive"),
        "{text}"
    );

    apply_fixture(&pool, BREAKING_FIXTURE).await;
    let before = recorded(&pool).await;
    let worker = kvmem_command(&url)
        .args(["worker", "--generator", "echo"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = exit_within(worker, Duration::from_secs(60));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    for needle in [
        "migrations of a newer kvmem release that are not additive",
        "29991231000002 (rename turn reply)",
        "run the release that applied them",
    ] {
        assert!(err.contains(needle), "{needle:?} not in {err}");
    }
    assert!(
        !err.contains("29991231000001"),
        "the additive one is named: {err}"
    );
    // `kvmem migrate` refuses the same way, and neither touched the queue or the schema.
    let out = run(&url, &["migrate"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("29991231000002 (rename turn reply)"));
    let text = String::from_utf8_lossy(&run(&url, &["migrate", "--status"]).stdout).into_owned();
    assert!(text.contains("(NOT additive)"), "{text}");
    assert!(text.contains("this binary does not run on it"), "{text}");
    assert_eq!(recorded(&pool).await, before);
    let (state, attempts): (String, i32) =
        sqlx::query_as("SELECT state::text, attempts FROM turns WHERE id = $1")
            .bind(turn.0)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((state.as_str(), attempts), ("queued", 0));
}

#[sqlx::test(migrations = false)]
async fn demo_refuses_a_database_that_holds_turns(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let turn = kvmem::queue::enqueue(&pool, "real-session", "u1", ch, "hello", None)
        .await
        .unwrap();
    let url = db_url(&pool).await;
    let help = String::from_utf8_lossy(&run(&url, &["demo", "--help"]).stdout).into_owned();
    assert!(
        help.contains("runs a full worker") && help.contains("--force"),
        "{help}"
    );
    let before = recorded(&pool).await;
    let out = run(&url, &["demo"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("already holds 1 turn(s)") && err.contains("pass --force"),
        "{err}"
    );
    let (state, attempts, turns): (String, i32, i64) = sqlx::query_as(
        "SELECT state::text, attempts, (SELECT count(*) FROM turns) FROM turns WHERE id = $1",
    )
    .bind(turn.0)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((state.as_str(), attempts, turns), ("queued", 0, 1));
    assert_eq!(recorded(&pool).await, before);
}

/// Every command's help says whether it writes, the subcommands of `memory` and `summary`
/// included.
#[test]
fn every_help_says_whether_the_command_writes() {
    let help = |args: &[&str]| -> String {
        let out = kvmem_command("postgres://unused@127.0.0.1:1/x")
            .args(args)
            .arg("--help")
            .output()
            .unwrap();
        assert_success(&out);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let commands = |text: &str| -> Vec<String> {
        text.lines()
            .skip_while(|l| !l.starts_with("Commands:"))
            .skip(1)
            .take_while(|l| l.starts_with("  "))
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .filter(|c| c != "help")
            .collect()
    };
    let mut checked = 0;
    for top in commands(&help(&[])) {
        let text = help(&[&top]);
        let subs = commands(&text);
        let pages: Vec<(String, String)> = if subs.is_empty() {
            vec![(top.clone(), text)]
        } else {
            subs.iter()
                .map(|s| (format!("{top} {s}"), help(&[&top, s])))
                .collect()
        };
        for (name, page) in pages {
            assert!(
                page.contains("Writes") || page.contains("Read-only"),
                "`kvmem {name} --help` does not say whether it writes:\n{page}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 25, "only {checked} help pages found");
}

/// A previous release's worker completes turns with its own SQL, which never sets
/// `chain_hash`; under this schema the database sets it, so the chat is still matched by
/// its history. Checked against the chain computed in Rust from the dialogue.
#[sqlx::test(migrations = false)]
async fn a_previous_release_completion_still_chains_the_dialogue(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u-old", "Ada").await;
    let exchanges = [
        ("hello there", "hi, traveller"),
        ("  where now? ", "north\n"),
    ];
    for (i, (message, reply)) in exchanges.iter().enumerate() {
        let id = kvmem::queue::enqueue(&pool, "s-old", "u-old", ch, message, None)
            .await
            .unwrap();
        let claimed = kvmem::queue::claim(&pool, "old-worker", 30_000, &["live".into()])
            .await
            .unwrap()
            .expect("the queued turn is claimable");
        assert_eq!(claimed.id, id, "exchange {i}");
        let input = serde_json::json!([{
            "turn_id": id.0, "session_id": "s-old", "fencing_token": claimed.fencing_token,
            "message": message, "reply": reply,
        }]);
        let done: Vec<(i64, String)> =
            sqlx::query_as(include_str!("../fixtures/previous_release_complete.sql"))
                .bind(input)
                .bind(vec![id.0])
                .fetch_all(&pool)
                .await
                .unwrap();
        assert_eq!(done.len(), 1, "the old completion marks the turn done");
        // That release frees the lease in a statement of its own, as this one does.
        let lease = serde_json::json!([{"session_id": "s-old", "fencing_token": claimed.fencing_token,
                                        "turn_id": id.0}]);
        sqlx::query(include_str!("../../sql/queue/release_many.sql"))
            .bind(lease)
            .bind(vec![id.0])
            .execute(&pool)
            .await
            .unwrap();
    }
    let stored: Vec<Option<Vec<u8>>> =
        sqlx::query_scalar("SELECT chain_hash FROM turns WHERE session_id = 's-old' ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let expected = kvmem::turn::chain::hashes(exchanges);
    assert_eq!(stored.len(), 2);
    for (i, (got, want)) in stored.iter().zip(&expected).enumerate() {
        assert_eq!(got.as_ref(), Some(want), "turn {i}'s chain hash");
    }
}
