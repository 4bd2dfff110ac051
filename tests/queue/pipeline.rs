//! The turn pipeline through the real queue and worker, on the tiny GGUF model: warm
//! resume, the plateau, bad snapshots, the rollback path and over-budget messages.

use crate::common;

use common::*;
use kvmem::runner::Outcome;
use kvmem::snapshot::{self, Limits, SegKind};
use sqlx::PgPool;

fn scene_settings(dir: &std::path::Path, extra: serde_json::Value) -> kvmem::config::Settings {
    let s = settings(serde_json::json!({
        "kv_dir": dir, "n_ctx": 1024, "kv_tail_tokens": 256, "reply_max_tokens": 24,
    }));
    s.with(extra).unwrap()
}

/// A migrated database with Ada for u1, and a tiny-model worker whose tail holds several
/// whole exchanges.
async fn long_tail_scene(pool: &PgPool) -> Scene {
    migrate(pool).await;
    let ch = character(pool, "u1", "Ada").await;
    let dir = tempfile::tempdir().unwrap();
    let s = scene_settings(dir.path(), serde_json::json!({ "kv_tail_tokens": 900 }));
    let engine = load_engine(&tiny_model(), &s);
    let deps = llama_deps(pool, s, engine.clone(), "w1");
    (ch, dir, engine, deps)
}

#[sqlx::test(migrations = false)]
async fn warm_turns_resume_and_plateau_under_the_tail(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let dir = tempfile::tempdir().unwrap();
    // zstd here, so the compressed path is resumed exactly too (the default is off).
    let s = scene_settings(dir.path(), serde_json::json!({ "kv_compress": true }));
    let engine = load_engine(&tiny_model(), &s);
    let deps = llama_deps(&pool, s, engine.clone(), "w1");
    let mut sizes = Vec::new();
    for t in 1..=30 {
        let (_, log) = one_turn(
            &deps,
            "scene",
            "u1",
            ch,
            &format!("Turn {t}: what do you see ahead?"),
        )
        .await;
        assert_eq!(log.status, "OK", "{:?}", log.error);
        assert!(
            log.tokens_in_kv <= 256,
            "turn {t}: {} tokens",
            log.tokens_in_kv
        );
        assert_eq!(log.cold, t == 1, "turn {t}: {:?}", log.cold_reason);
        assert_eq!(log.loaded, t > 1);
        sizes.push(log.kv_bytes);
    }
    // Bytes plateau: the last ten saves stay in a band. A prune takes the KV down to 3/4
    // of the tail less the new exchange, and it grows back to the tail.
    let last = &sizes[20..];
    let (lo, hi) = (last.iter().min().unwrap(), last.iter().max().unwrap());
    assert!(*hi as f64 <= *lo as f64 * 2.0, "no plateau: {sizes:?}");
    assert!(sizes[29] > sizes[0], "KV did not grow at all: {sizes:?}");
    // The saved KV starts with the base prompt and ends with the current HUD, the only
    // one it holds: HUDs never accumulate.
    let scope = snapshot::scope_key("u1", ch, "scene");
    let file = std::fs::read(dir.path().join(format!("{scope}.llkv"))).unwrap();
    let snap = snapshot::decode(&file, Limits::LOOSE).unwrap();
    let segs = &snap.header.segments;
    assert_eq!(segs[0].kind, snapshot::SegKind::Base);
    assert_eq!(segs.last().unwrap().kind, snapshot::SegKind::Hud);
    assert_eq!(
        segs.iter()
            .filter(|s| s.kind == snapshot::SegKind::Hud)
            .count(),
        1
    );
    let text = engine.detokenize(
        &snap
            .token_ids
            .iter()
            .map(|&t| llama_cpp_2::token::LlamaToken(t))
            .collect::<Vec<_>>(),
    );
    assert!(text.contains("You are Ada"), "{text}");
    assert_eq!(
        text.matches("HUD:").count(),
        1,
        "HUD accumulated in the KV: {text}"
    );
    let hud_at = text.find("HUD:").unwrap();
    assert!(
        text[hud_at..].contains("HP 85/100") && !text[hud_at..].contains("Turn 30"),
        "the KV does not end with the character's HUD: {text}"
    );
    assert!(
        text.contains("Turn 30") && !text.contains("Turn 1:"),
        "tail should hold only recent turns"
    );
}

#[sqlx::test(migrations = false)]
async fn corrupt_snapshots_are_quarantined_and_the_turn_runs_cold(pool: PgPool) {
    corruption_matrix(pool, false).await;
}

#[sqlx::test(migrations = false)]
async fn corrupt_zstd_snapshots_are_quarantined_and_the_turn_runs_cold(pool: PgPool) {
    corruption_matrix(pool, true).await;
}

/// Every damage case, on snapshots written with `KV_COMPRESS` off or on.
async fn corruption_matrix(pool: PgPool, compress: bool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let dir = tempfile::tempdir().unwrap();
    let s = scene_settings(dir.path(), serde_json::json!({ "kv_compress": compress }));
    let deps = llama_deps(&pool, s.clone(), load_engine(&tiny_model(), &s), "w1");
    let path = dir
        .path()
        .join(format!("{}.llkv", snapshot::scope_key("u1", ch, "s")));
    one_turn(&deps, "s", "u1", ch, "hello").await;
    let good = std::fs::read(&path).unwrap();
    let header_len = good.windows(2).position(|w| w == b"\n\n").unwrap() + 2;
    let crc_line = find(&good, b"\ncrc32c=") + 9;
    let tokens_end = header_len + 4 * token_count(&good);
    let damage: Vec<(&str, Vec<u8>)> = vec![
        ("flipped CRC digit", {
            let mut b = good.clone();
            b[crc_line] = if b[crc_line] == b'1' { b'2' } else { b'1' };
            b
        }),
        ("truncated at header end", good[..header_len].to_vec()),
        ("truncated after token ids", good[..tokens_end].to_vec()),
        ("truncated one byte short", good[..good.len() - 1].to_vec()),
        (
            "header claims 2^40 bytes",
            forge_header(&good, "bytes", &(1u64 << 40).to_string()),
        ),
        (
            "header claims 2^40 stored bytes",
            forge_header(&good, "stored_bytes", &(1u64 << 40).to_string()),
        ),
        ("flipped payload byte", {
            let mut b = good.clone();
            let n = b.len() - 10;
            b[n] ^= 0x40;
            b
        }),
        ("flipped header byte", {
            let mut b = good.clone();
            b[20] ^= 0x01;
            b
        }),
        ("truncated", good[..good.len() / 2].to_vec()),
        ("truncated in header", good[..header_len - 5].to_vec()),
        ("zero length", Vec::new()),
        (
            "random garbage",
            (0..4096u32)
                .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
                .collect(),
        ),
    ];
    for (what, bytes) in damage {
        std::fs::write(&path, &bytes).unwrap();
        let before = files_with_ext(dir.path(), ".bad").len();
        let (_, log) = one_turn(&deps, "s", "u1", ch, &format!("after {what}")).await;
        assert_eq!(log.status, "OK", "{what}: {:?}", log.error);
        assert!(log.cold && !log.loaded, "{what}: expected a cold start");
        assert!(
            log.cold_reason.as_deref().unwrap_or("").contains("corrupt"),
            "{what}: {:?}",
            log.cold_reason
        );
        assert_eq!(
            files_with_ext(dir.path(), ".bad").len(),
            before + 1,
            "{what}: not quarantined"
        );
        // The next turn is warm again from the fresh snapshot.
        let (_, log) = one_turn(&deps, "s", "u1", ch, "and again").await;
        assert!(
            log.loaded && !log.cold,
            "{what}: no warm turn after recovery"
        );
    }
    let events: i64 =
        sqlx::query_scalar("SELECT count(*) FROM events WHERE kind = 'snapshot_quarantined'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(events, 12);
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .expect("needle")
}

fn token_count(file: &[u8]) -> usize {
    let (h, _) = snapshot::parse_header(file, Limits::LOOSE).unwrap();
    h.tokens as usize
}

/// Rewrites one header field and re-seals the header CRC, so only the parser's own
/// checks (limits, lengths) can catch the lie.
fn forge_header(file: &[u8], key: &str, value: &str) -> Vec<u8> {
    let end = find(file, b"\n\n") + 2;
    let head = std::str::from_utf8(&file[..end]).unwrap();
    let mut lines: Vec<String> = head.lines().map(str::to_string).collect();
    for l in &mut lines {
        if l.starts_with(&format!("{key}=")) {
            *l = format!("{key}={value}");
        }
    }
    lines.retain(|l| !l.is_empty() && !l.starts_with("header_crc32c="));
    let mut text = lines.join("\n");
    text.push('\n');
    let crc = crc32c::crc32c(text.as_bytes());
    text.push_str(&format!("header_crc32c={crc}\n\n"));
    let mut out = text.into_bytes();
    out.extend_from_slice(&file[end..]);
    out
}

#[sqlx::test(migrations = false)]
async fn a_snapshot_from_another_kv_type_is_quarantined_and_the_turn_runs_cold(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let dir = tempfile::tempdir().unwrap();
    let s32 = scene_settings(dir.path(), serde_json::json!({ "kv_type": "f32" }));
    let a = llama_deps(&pool, s32.clone(), load_engine(&tiny_model(), &s32), "w32");
    one_turn(&a, "s", "u1", ch, "saved as f32").await;
    drop(a);
    let s16 = scene_settings(dir.path(), serde_json::json!({}));
    let b = llama_deps(&pool, s16.clone(), load_engine(&tiny_model(), &s16), "w16");
    let (_, log) = one_turn(&b, "s", "u1", ch, "read as f16").await;
    assert!(log.cold && log.status == "OK");
    assert!(log.cold_reason.unwrap().contains("KV type f32/f32 != f16"));
    assert_eq!(files_with_ext(dir.path(), ".bad").len(), 1);
    let (_, log) = one_turn(&b, "s", "u1", ch, "warm again").await;
    assert!(log.loaded && !log.cold);
}

#[sqlx::test(migrations = false)]
async fn users_sharing_a_character_name_never_share_memory(pool: PgPool) {
    migrate(&pool).await;
    let ada_a = character(&pool, "alice", "Ada").await;
    let ada_b = character(&pool, "bob", "Ada").await;
    sqlx::query("UPDATE user_characters SET wallet = 9 WHERE id = $1")
        .bind(ada_b)
        .execute(&pool)
        .await
        .unwrap();
    fact(&pool, "alice-s", "conflict", "war", "Alice's secret war").await;
    let dir = tempfile::tempdir().unwrap();
    let s = scene_settings(dir.path(), serde_json::json!({}));
    let engine = load_engine(&tiny_model(), &s);
    let deps = llama_deps(&pool, s, engine.clone(), "w");
    let (_, a1) = one_turn(&deps, "alice-s", "alice", ada_a, "hello").await;
    let (_, b1) = one_turn(&deps, "bob-s", "bob", ada_b, "hello").await;
    assert!(
        a1.digest_injected && !b1.digest_injected,
        "bob has no facts to inject"
    );
    assert_ne!(a1.digest_version, b1.digest_version);
    let bob_digest: String =
        sqlx::query_scalar("SELECT digest_content FROM state_digest WHERE session_id = 'bob-s'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(bob_digest.is_empty());
    // Each has a snapshot of their own; bob's KV holds none of alice's text.
    let bob_file = dir.path().join(format!(
        "{}.llkv",
        snapshot::scope_key("bob", ada_b, "bob-s")
    ));
    let snap = snapshot::decode(&std::fs::read(&bob_file).unwrap(), Limits::LOOSE).unwrap();
    let ids: Vec<_> = snap
        .token_ids
        .iter()
        .map(|&t| llama_cpp_2::token::LlamaToken(t))
        .collect();
    assert!(!engine.detokenize(&ids).contains("secret war"));
    assert_ne!(
        snapshot::scope_key("alice", ada_a, "alice-s"),
        snapshot::scope_key("bob", ada_b, "bob-s")
    );
    // The HUD is scoped by user: bob's character id under alice's name gives nothing.
    assert!(kvmem::context::hud::fetch(&pool, ada_b, "alice")
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        kvmem::context::hud::fetch(&pool, ada_b, "bob")
            .await
            .unwrap()
            .unwrap()
            .wallet,
        9
    );
    // Bob cannot write into alice's session, even knowing its id.
    let err = kvmem::queue::enqueue(&pool, "alice-s", "bob", ada_b, "let me in", None)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("belongs to another user"), "{err}");
    // Nor use alice's character.
    let err = kvmem::queue::enqueue(&pool, "bob-2", "bob", ada_a, "borrow", None)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("unknown character"), "{err}");
}

#[sqlx::test(migrations = false)]
async fn another_model_means_one_cold_start_then_warm(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let dir = tempfile::tempdir().unwrap();
    let s = scene_settings(dir.path(), serde_json::json!({}));
    let a = llama_deps(&pool, s.clone(), load_engine(&tiny_model(), &s), "w1");
    one_turn(&a, "s", "u1", ch, "one").await;
    let (_, log) = one_turn(&a, "s", "u1", ch, "two").await;
    assert!(log.loaded);
    drop(a);
    let b = llama_deps(&pool, s.clone(), load_engine(&tiny_model_alt(), &s), "w2");
    let (id, log) = one_turn(&b, "s", "u1", ch, "three").await;
    assert!(log.cold && !log.loaded);
    // Token ids recorded by another model mean nothing to this one: the text rebuild.
    let reason = log.cold_reason.unwrap();
    assert!(
        reason.contains("model_sha") && reason.contains("text rebuild: model changed"),
        "{reason}"
    );
    let rebuild: Option<String> = sqlx::query_scalar(
        "SELECT rebuild FROM turn_log WHERE turn_id = $1 ORDER BY id DESC LIMIT 1",
    )
    .bind(id.0)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(rebuild.as_deref(), Some("text"));
    let (_, log) = one_turn(&b, "s", "u1", ch, "four").await;
    assert!(log.loaded && !log.cold);
    assert_eq!(
        files_with_ext(dir.path(), ".bad").len(),
        1,
        "the foreign model's snapshot is kept aside"
    );
}

#[sqlx::test(migrations = false)]
async fn cold_start_rereads_the_dialogue(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let dir = tempfile::tempdir().unwrap();
    let s = scene_settings(dir.path(), serde_json::json!({ "kv_only_enabled": false }));
    let deps = llama_deps(
        &pool,
        s,
        load_engine(
            &tiny_model(),
            &scene_settings(dir.path(), serde_json::json!({})),
        ),
        "w1",
    );
    for t in 1..=4 {
        let (_, log) = one_turn(&deps, "s", "u1", ch, &format!("message {t}")).await;
        assert!(log.cold && !log.loaded, "rollback path must always be cold");
        assert_eq!(log.tokens_in_kv, 0);
    }
    assert!(
        std::fs::read_dir(dir.path())
            .map(|d| d.count())
            .unwrap_or(0)
            == 0,
        "rollback path wrote a snapshot"
    );
    let path: String = sqlx::query_scalar("SELECT path FROM turn_log ORDER BY id DESC LIMIT 1")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(path, "rollback");
    // Nothing is ever restored on this path.
    let loaded: Vec<i32> = sqlx::query_scalar("SELECT tokens_loaded FROM turn_log ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(loaded, vec![0, 0, 0, 0]);
}

/// A cold start (the snapshot is gone) prefills the earlier exchanges from `messages`: the
/// KV it saves holds every earlier user message, not only the new turn.
#[sqlx::test(migrations = false)]
async fn a_cold_start_prefills_the_earlier_exchanges(pool: PgPool) {
    let (ch, dir, engine, deps) = long_tail_scene(&pool).await;
    let words = ["amber", "basalt", "cobalt"];
    for w in words {
        let (_, log) = one_turn(&deps, "s", "u1", ch, &format!("remember {w}")).await;
        assert_eq!(log.status, "OK");
    }
    let files = files_with_ext(dir.path(), ".llkv");
    assert_eq!(files.len(), 1);
    std::fs::remove_file(&files[0]).unwrap();

    let (_, log) = one_turn(&deps, "s", "u1", ch, "what did I say?").await;
    assert_eq!(log.status, "OK", "{log:?}");
    assert!(log.cold, "{log:?}");
    assert_eq!(log.cold_reason.as_deref(), Some("no snapshot"));

    let bytes = std::fs::read(&files_with_ext(dir.path(), ".llkv")[0]).unwrap();
    let snap = snapshot::decode(&bytes, Limits::LOOSE).unwrap();
    let tokens: Vec<_> = snap
        .token_ids
        .iter()
        .map(|&t| llama_cpp_2::token::LlamaToken::new(t))
        .collect();
    let text = engine.detokenize(&tokens);
    for w in words {
        assert!(
            text.contains(&format!("remember {w}")),
            "{w} missing from the rebuilt KV: {text}"
        );
    }
}

/// The HUD off the first-token path: the saved KV ends with the HUD (and the next user
/// block's opening), a warm turn whose HUD has not changed decodes its message alone, and
/// a changed HUD replaces the old one, which leaves the KV, so the KV never holds two.
#[sqlx::test(migrations = false)]
async fn an_unchanged_hud_stays_in_the_kv_and_a_changed_one_replaces_it(pool: PgPool) {
    let (ch, _dir, engine, deps) = long_tail_scene(&pool).await;
    let (_, first) = one_turn(&deps, "s", "u1", ch, "hello there").await;
    assert!(first.cold && !first.hud_kept, "{first:?}");

    let msg = "what is ahead of us?";
    let (_, warm) = one_turn(&deps, "s", "u1", ch, msg).await;
    assert!(warm.loaded && warm.hud_kept, "{warm:?}");
    // The HUD segment ends with the user block's opening: only the message and the
    // block's close are left to decode.
    let opener = engine
        .tokenize_special(&engine.frame.user.parts[0], false)
        .len();
    let message = (engine.block(&engine.frame.user, &[msg]).len() - opener) as i32;
    assert_eq!(warm.prefill_tokens, message, "{warm:?}");
    let kv = kv_segments(&pool, &engine, "s").await;
    let huds: Vec<_> = kv.iter().filter(|(s, _)| s.kind == SegKind::Hud).collect();
    assert_eq!(huds.len(), 1, "{kv:?}");
    assert_eq!(kv.last().unwrap().0.kind, SegKind::Hud);
    assert!(huds[0].1.contains("HP 85/100"), "{kv:?}");

    sqlx::query("UPDATE user_characters SET current_health = 40 WHERE id = $1")
        .bind(ch)
        .execute(&pool)
        .await
        .unwrap();
    let (_, changed) = one_turn(&deps, "s", "u1", ch, msg).await;
    assert!(changed.loaded && !changed.hud_kept, "{changed:?}");
    assert!(changed.prefill_tokens > message, "{changed:?}");
    let kv = kv_segments(&pool, &engine, "s").await;
    let text: String = kv.iter().map(|(_, t)| t.as_str()).collect();
    assert_eq!(text.matches("HUD:").count(), 1, "{text}");
    assert!(!text.contains("HP 85/100"), "the old HUD stayed: {text}");
    assert_eq!(kv.last().unwrap().0.kind, SegKind::Hud);
    assert!(kv.last().unwrap().1.contains("HP 40/100"), "{kv:?}");
    // Each exchange is one segment, tagged with its turn, and none holds a HUD.
    let turns = kv.iter().filter(|(s, _)| s.kind == SegKind::Turn).count();
    assert_eq!(turns, 3, "{kv:?}");
}

#[sqlx::test(migrations = false)]
async fn a_message_that_cannot_fit_fails_and_the_session_continues(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let dir = tempfile::tempdir().unwrap();
    let s = scene_settings(
        dir.path(),
        serde_json::json!({ "n_ctx": 256, "kv_tail_tokens": 128 }),
    );
    let deps = llama_deps(&pool, s.clone(), load_engine(&tiny_model(), &s), "w1");
    let huge = "word ".repeat(600);
    let big = kvmem::queue::enqueue(&pool, "s", "u1", ch, &huge, None)
        .await
        .unwrap();
    let next = kvmem::queue::enqueue(&pool, "s", "u1", ch, "a short one", None)
        .await
        .unwrap();
    let outcomes = drain(&deps).await;
    assert_eq!(outcomes, vec![Outcome::Failed(big), Outcome::Done(next)]);
    let (state, error): (String, String) =
        sqlx::query_as("SELECT state::text, error FROM turns WHERE id = $1")
            .bind(big.0)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(state, "failed");
    assert!(
        error.contains("does not fit the context") && error.contains("N_CTX 256"),
        "{error}"
    );
}

#[sqlx::test(migrations = false)]
async fn an_unwritable_snapshot_dir_skips_the_save_and_the_turn_completes(pool: PgPool) {
    migrate(&pool).await;
    let ch = character(&pool, "u1", "Ada").await;
    let dir = tempfile::tempdir().unwrap();
    // A file where the directory should be: every save fails.
    let blocked = dir.path().join("kv");
    std::fs::write(&blocked, b"not a directory").unwrap();
    let s = scene_settings(&blocked, serde_json::json!({}));
    let deps = llama_deps(&pool, s.clone(), load_engine(&tiny_model(), &s), "w1");
    for msg in ["one", "two"] {
        let (_, log) = one_turn(&deps, "s", "u1", ch, msg).await;
        assert_eq!(log.status, "OK");
        assert!(log.cold, "without a saved snapshot every turn is cold");
    }
}
