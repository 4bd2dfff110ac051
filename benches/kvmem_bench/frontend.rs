//! The front-end suite (issue 60): requests that name no session, matched by their
//! history's chain hash. (1) The warm share of turns for a front-end-style client: 50 chats
//! of 10 messages, each request carrying the whole history, with 10 % of the replies
//! regenerated, through the real pipeline on the tiny model (`KVMEM_BENCH_FRONTEND_CHATS`
//! sets the number of chats). (2) The match's own latency
//! with 10,000 sessions of one user and character: a continue, a branch and a new chat,
//! beside an enqueue that names its session, measured interleaved in one run.

use super::*;
use kvmem::queue::{self, Conversation, Found, Placed, Repeat};
use rand::{Rng, SeedableRng};

fn fe_settings(dir: &Path) -> Result<Settings> {
    Ok(Settings::defaults().with(json!({
        "kv_dir": dir, "n_ctx": 1024, "kv_tail_tokens": 768, "reply_max_tokens": 12,
        "memory_lane": false, "summary_lane": false, "log_level": "warn",
        // One thread: on a shared machine ggml's spinning threads otherwise wait on each other.
        "n_threads": 1,
    }))?)
}

/// A request's hash: unique per request, so no request is taken for a retry of another.
fn unique(n: &mut u64) -> String {
    *n += 1;
    format!("bench-{n}")
}

async fn place(
    pool: &PgPool,
    user: &str,
    ch: i64,
    history: &[(String, String)],
    message: &str,
    n: &mut u64,
) -> Result<Placed> {
    let hash = unique(n);
    let c = Conversation {
        user_id: user,
        character_id: ch,
        message,
        history,
        idempotency_key: None,
        options: None,
        limits: queue::HistoryLimits {
            messages: usize::MAX,
            chars: usize::MAX,
        },
    };
    let repeat = Repeat {
        hash: &hash,
        retry: false,
        window_ms: 0,
    };
    Ok(queue::enqueue_matched(pool, &c, repeat).await?)
}

/// Runs the queue until `id` is done; its reply and whether it started cold.
async fn finish(deps: &Deps, id: queue::TurnId) -> Result<(String, bool)> {
    let never = CancellationToken::new();
    loop {
        match runner::process_next_turn(deps, &never).await? {
            Outcome::Done(t) if t == id => break,
            Outcome::Empty => anyhow::bail!("turn {id} not runnable"),
            other if other == Outcome::Failed(id) => anyhow::bail!("turn {id} failed"),
            _ => {}
        }
    }
    Ok(sqlx::query_as(
        "SELECT t.reply, l.cold FROM turns t
           JOIN turn_log l ON l.turn_id = t.id AND l.status = 'OK' WHERE t.id = $1",
    )
    .bind(id.0)
    .fetch_one(&deps.pool)
    .await?)
}

/// Turns and cold ones, per way the session was found.
#[derive(Default)]
struct Tally(BTreeMap<&'static str, (u32, u32)>);

impl Tally {
    fn add(&mut self, found: &Found, cold: bool) {
        let kind = match found {
            Found::Repeat => "repeat",
            Found::Continued => "continued",
            Found::Branched { .. } => "branched",
            Found::Started => "started",
        };
        let e = self.0.entry(kind).or_default();
        e.0 += 1;
        e.1 += cold as u32;
    }
}

async fn warm_share(env: &Env, tiny: &str) -> Result<Value> {
    let chats = match std::env::var("KVMEM_BENCH_FRONTEND_CHATS") {
        Ok(n) => n.parse().context("KVMEM_BENCH_FRONTEND_CHATS")?,
        Err(_) if env.quick => 10,
        Err(_) => 50,
    };
    let messages = if env.quick { 6 } else { 10 };
    let (pool, _) = fresh_db(env, "kvmem_bench_frontend").await?;
    let dir = tempfile::tempdir()?;
    let s = fe_settings(dir.path())?;
    let engine = Arc::new(kvmem::system::load_engine(
        Path::new(tiny),
        None,
        EngineParams::from_settings(&s),
    )?);
    let deps = llama_deps(&pool, s, engine)?;
    let ch = character(&pool).await?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(60);
    let (mut tally, mut n) = (Tally::default(), 0u64);
    for chat in 0..chats {
        let mut history: Vec<(String, String)> = Vec::new();
        for k in 0..messages {
            let (message, _) = filler(chat * messages + k);
            let placed = place(&pool, "bench", ch, &history, &message, &mut n).await?;
            let (mut reply, cold) = finish(&deps, placed.turn).await?;
            tally.add(&placed.found, cold);
            if rng.gen_bool(0.1) {
                let again = place(&pool, "bench", ch, &history, &message, &mut n).await?;
                // Branched, or started (the first message); or continued, where an earlier
                // regenerate gave the same reply, so that another session's dialogue is
                // this one's word for word and the request continues it.
                anyhow::ensure!(again.found != Found::Repeat, "a regenerate was a repeat");
                let (regenerated, cold) = finish(&deps, again.turn).await?;
                tally.add(&again.found, cold);
                reply = regenerated;
            }
            history.push((message, reply));
        }
    }
    let (turns, cold) = tally
        .0
        .values()
        .fold((0, 0), |(t, c), (n, k)| (t + n, c + k));
    println!("## frontend: warm share\n");
    println!("{chats} chats of {messages} messages, 10 % regenerated (seeded), the tiny model; every request carries the whole history and no session id.\n");
    println!("| found as | turns | cold | warm share |");
    println!("|---|---:|---:|---:|");
    for (kind, (t, c)) in &tally.0 {
        println!(
            "| {kind} | {t} | {c} | {:.1} % |",
            100.0 * (t - c) as f64 / *t as f64
        );
    }
    println!(
        "| all | {turns} | {cold} | {:.1} % |\n",
        100.0 * (turns - cold) as f64 / turns as f64
    );
    let by_kind: BTreeMap<&str, Value> = tally
        .0
        .iter()
        .map(|(k, (t, c))| (*k, json!({"turns": t, "cold": c})))
        .collect();
    Ok(
        json!({"chats": chats, "messages": messages, "turns": turns, "cold": cold,
              "warm_share": (turns - cold) as f64 / turns as f64, "by_kind": by_kind}),
    )
}

/// 10,000 sessions of `exchanges` done turns each, with their chain hashes, for one user
/// and character (turn rows only: the match reads those).
async fn seed_sessions(pool: &PgPool, ch: i64, sessions: usize, exchanges: usize) -> Result<()> {
    for start in (0..sessions).step_by(1000) {
        let (mut sid, mut msg, mut rep, mut hash) = (vec![], vec![], vec![], vec![]);
        for s in start..(start + 1000).min(sessions) {
            let dialogue = session_dialogue(s, exchanges);
            let hashes =
                kvmem::turn::chain::hashes(dialogue.iter().map(|(m, r)| (m.as_str(), r.as_str())));
            for ((m, r), h) in dialogue.into_iter().zip(hashes) {
                sid.push(format!("seed-{s}"));
                msg.push(m);
                rep.push(r);
                hash.push(h);
            }
        }
        sqlx::query(
            "INSERT INTO turns (session_id, user_id, character_id, message, reply, state,
                                finished_at, chain_hash, origin)
             SELECT s, 'bench', $1, m, r, 'done', now(), h, 'import'
               FROM unnest($2::text[], $3::text[], $4::text[], $5::bytea[]) AS x(s, m, r, h)",
        )
        .bind(ch)
        .bind(&sid)
        .bind(&msg)
        .bind(&rep)
        .bind(&hash)
        .execute(pool)
        .await?;
    }
    sqlx::query("ANALYZE turns").execute(pool).await?;
    Ok(())
}

fn session_dialogue(s: usize, exchanges: usize) -> Vec<(String, String)> {
    (0..exchanges)
        .map(|k| {
            let (m, r) = filler(s * exchanges + k);
            (format!("[{s}] {m}"), r)
        })
        .collect()
}

async fn match_latency(env: &Env) -> Result<Value> {
    let (sessions, rounds) = if env.quick { (2000, 40) } else { (10_000, 200) };
    const EXCHANGES: usize = 4;
    let (pool, _) = fresh_db(env, "kvmem_bench_frontend_match").await?;
    let ch = character(&pool).await?;
    seed_sessions(&pool, ch, sessions, EXCHANGES).await?;
    let mut n = 0u64;
    let mut times: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    // Each round uses sessions of its own, so every continue finds its session's latest
    // turn and every branch an earlier one.
    for round in 0..rounds {
        let (a, b) = (2 * round, 2 * round + 1);
        let full = session_dialogue(a, EXCHANGES);
        let t = Instant::now();
        let p = place(&pool, "bench", ch, &full, "And next?", &mut n).await?;
        times.entry("continue").or_default().push(ms(t));
        anyhow::ensure!(p.found == Found::Continued, "{:?}", p.found);

        let early = session_dialogue(b, EXCHANGES)[..2].to_vec();
        let t = Instant::now();
        let p = place(&pool, "bench", ch, &early, "Edited.", &mut n).await?;
        times
            .entry("branch (2 turns copied)")
            .or_default()
            .push(ms(t));
        anyhow::ensure!(matches!(p.found, Found::Branched { .. }), "{:?}", p.found);

        let unseen = session_dialogue(sessions + round, EXCHANGES);
        let t = Instant::now();
        let p = place(&pool, "bench", ch, &unseen, "Hello?", &mut n).await?;
        times
            .entry("new (4 turns imported)")
            .or_default()
            .push(ms(t));
        anyhow::ensure!(p.found == Found::Started, "{:?}", p.found);

        let sid = format!("named-{round}");
        let t = Instant::now();
        let turn = queue::NewTurn {
            session_id: &sid,
            user_id: "bench",
            character_id: ch,
            message: "Hello?",
            idempotency_key: None,
            options: None,
        };
        let hash = unique(&mut n);
        let repeat = Repeat {
            hash: &hash,
            retry: false,
            window_ms: 0,
        };
        queue::enqueue_repeatable(&pool, &turn, repeat).await?;
        times
            .entry("session named (no match)")
            .or_default()
            .push(ms(t));
    }
    println!("## frontend: the match's latency\n");
    println!("{sessions} sessions of {EXCHANGES} turns for one user and character; {rounds} requests of each kind, interleaved; the whole enqueue (lock, repeat check, match, copy or import, enqueue, commit).\n");
    println!("| request | p50 ms | p95 ms | max ms |");
    println!("|---|---:|---:|---:|");
    let mut out = serde_json::Map::new();
    for (kind, v) in &mut times {
        println!(
            "| {kind} | {:.2} | {:.2} | {:.2} |",
            median(v),
            pct(v, 0.95),
            pct(v, 1.0)
        );
        out.insert(kind.to_string(), json!({"p50_ms": median(v), "p95_ms": pct(v, 0.95), "max_ms": pct(v, 1.0), "n": v.len()}));
    }
    println!();
    Ok(json!({"sessions": sessions, "exchanges": EXCHANGES, "rounds": rounds, "latency": out}))
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

pub(crate) async fn frontend(env: &Env) -> Result<Value> {
    let tiny = std::env::var("KVMEM_BENCH_TINY").context("KVMEM_BENCH_TINY (ops/bench sets it)")?;
    let latency = match_latency(env).await?;
    let warm = warm_share(env, &tiny).await?;
    Ok(json!({"warm_share": warm, "match": latency}))
}
