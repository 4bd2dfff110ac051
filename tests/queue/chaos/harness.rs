//! The chaos runs' harness: the run itself, its statistics and the verdict over the
//! database afterwards.

use super::*;
#[derive(Default)]
pub(super) struct Stats {
    pub(super) kills: usize,
    pub(super) timer_kills: usize,
    /// Kills after which a turn of the killed pid was still `running` in the database.
    pub(super) kills_busy: usize,
    /// Turns left running by killed workers, summed over kills.
    pub(super) stranded: i64,
    /// Kills aimed at a snapshot write in progress (its `.tmp` file was seen).
    pub(super) snipes: usize,
    /// ... whose `.tmp` file was still there after the process died: killed mid-write.
    pub(super) snipes_mid_write: usize,
    /// Kills right after a snapshot's rename, aimed between the save and the commit.
    pub(super) post_save: usize,
    /// ... whose turn was still running after the process died: killed before the commit.
    pub(super) post_save_before_commit: usize,
    /// The turns those kills left running: each one's next attempt must find the snapshot stale.
    pub(super) post_save_turns: Vec<i64>,
    pub(super) crashes: Vec<String>,
    /// Workers that got the final SIGTERM before installing their handler (see `Fleet::stop`).
    pub(super) sigterm_while_starting: usize,
    pub(super) violations: Vec<String>,
    pub(super) samples: usize,
}

impl Stats {
    /// Counts a kill; returns the turns the killed process left running.
    pub(super) async fn record_kill(&mut self, pool: &PgPool, pid: u32) -> Vec<i64> {
        self.kills += 1;
        let running: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM turns WHERE state = 'running' AND worker_id LIKE $1",
        )
        .bind(format!("%:{pid}:%"))
        .fetch_all(pool)
        .await
        .unwrap();
        if !running.is_empty() {
            self.kills_busy += 1;
            self.stranded += running.len() as i64;
        }
        running
    }

    pub(super) fn restart_crashed(&mut self, fleet: &mut Fleet) {
        for (slot, report) in fleet.exited_by_themselves() {
            eprintln!("{report}");
            self.crashes.push(report);
            fleet.start(slot);
        }
    }

    /// Queue invariants, read in one snapshot. Any hit is recorded with its rows.
    pub(super) async fn sample(&mut self, pool: &PgPool) {
        self.samples += 1;
        let rows: Vec<String> = sqlx::query_scalar(
            "SELECT format('running turn %s of %s by %s without its lease (lease turn %s owner %s)',
                           t.id, t.session_id, t.worker_id, l.turn_id, l.owner)
               FROM turns t LEFT JOIN session_locks l USING (session_id)
              WHERE t.state = 'running'
                AND (l.turn_id IS DISTINCT FROM t.id OR l.owner IS DISTINCT FROM t.worker_id)
             UNION ALL
             SELECT format('lease on %s for turn %s by %s (token %s) but the turn is %s',
                           l.session_id, l.turn_id, l.owner, l.fencing_token,
                           coalesce((SELECT t.state::text FROM turns t WHERE t.id = l.turn_id), 'missing'))
               FROM session_locks l
              WHERE l.turn_id IS NOT NULL
                AND NOT EXISTS (SELECT 1 FROM turns t WHERE t.id = l.turn_id AND t.state = 'running')
             UNION ALL
             SELECT format('free session %s points at head %s but its oldest queued turn is %s',
                           l.session_id, l.head_turn_id, q.id)
               FROM session_locks l
               LEFT JOIN LATERAL (SELECT min(t.id) AS id FROM turns t
                                   WHERE t.session_id = l.session_id AND t.state = 'queued') q ON true
              WHERE l.turn_id IS NULL AND l.head_turn_id IS DISTINCT FROM q.id",
        )
        .fetch_all(pool)
        .await
        .unwrap();
        for row in rows {
            if self.violations.len() < 50 {
                eprintln!(
                    "{}: invariant: {row}",
                    chrono::Utc::now().format("%H:%M:%S%.3f")
                );
                self.violations.push(row);
            }
        }
    }
}

/// Aimed kills. Workers run with a stop point (`KVMEM_TEST_STOP_AT`) and stop themselves
/// there: `mid_write` with half the snapshot bytes in its `.tmp` file, `after_save` with the
/// snapshot renamed into place and the completion not yet committed. A stopped worker is
/// SIGKILLed at exactly that step, then restarted aimed at whichever kind is still short of
/// `required` kills, or not aimed once both are done.
pub(super) async fn aim(
    pool: &PgPool,
    fleet: &mut Fleet,
    dir: &Path,
    required: usize,
    stats: &mut Stats,
) {
    for slot in 0..fleet.len() {
        let Some((pid, point)) = fleet.stopped(slot) else {
            continue;
        };
        let tmp_before = tmp_files(dir).iter().any(|(_, p)| *p == pid);
        fleet.kill(slot);
        let running = stats.record_kill(pool, pid).await;
        match point {
            "mid_write" => {
                stats.snipes += 1;
                // The partial file is still there: the writer died mid-write.
                if tmp_before && tmp_files(dir).iter().any(|(_, p)| *p == pid) {
                    stats.snipes_mid_write += 1;
                }
            }
            _ => {
                stats.post_save += 1;
                if !running.is_empty() {
                    stats.post_save_before_commit += 1;
                    stats.post_save_turns.extend(running);
                }
            }
        }
        fleet.aims[slot] = if stats.snipes_mid_write < required {
            Some("mid_write")
        } else if stats.post_save_before_commit < required {
            Some("after_save")
        } else {
            None
        };
        fleet.start(slot);
    }
}

/// Kills workers until the plan's kills are done and everything is enqueued, restarting
/// each victim at once.
pub(super) async fn chaos(
    pool: &PgPool,
    fleet: &mut Fleet,
    rng: &mut StdRng,
    plan: &Plan,
    enqueuer: &tokio::task::JoinHandle<()>,
    stats: &mut Stats,
) {
    let started = Instant::now();
    let gap = |rng: &mut StdRng| {
        Duration::from_millis(rng.gen_range(plan.kill_gap_ms.0..=plan.kill_gap_ms.1))
    };
    let mut next_kill = Instant::now() + gap(rng);
    let mut next_sample = Instant::now();
    let mut next_report = Instant::now() + Duration::from_secs(5);
    let tick = Duration::from_millis(5);
    let aims_done = |stats: &Stats| {
        plan.snipe.as_ref().is_none_or(|(_, required)| {
            stats.snipes_mid_write >= *required && stats.post_save_before_commit >= *required
        })
    };
    while stats.timer_kills < plan.kills || !enqueuer.is_finished() || !aims_done(stats) {
        assert!(
            started.elapsed() < plan.drain_timeout,
            "{}: aimed kills not done in {:?}: mid-write {}/{} after-save {}/{}",
            plan.name,
            plan.drain_timeout,
            stats.snipes_mid_write,
            stats.snipes,
            stats.post_save_before_commit,
            stats.post_save
        );
        tokio::time::sleep(tick).await;
        stats.restart_crashed(fleet);
        if let Some((dir, required)) = &plan.snipe {
            aim(pool, fleet, dir, *required, stats).await;
        }
        if stats.timer_kills < plan.kills && Instant::now() >= next_kill {
            let slot = rng.gen_range(0..fleet.len());
            // A worker stopped at its stop point is the aimed kill's, not the timer's.
            if fleet.stopped(slot).is_some() {
                continue;
            }
            if let Some(pid) = fleet.kill(slot) {
                stats.timer_kills += 1;
                stats.record_kill(pool, pid).await;
            }
            fleet.start(slot);
            next_kill = Instant::now() + gap(rng);
        }
        if Instant::now() >= next_sample {
            stats.sample(pool).await;
            next_sample = Instant::now() + Duration::from_millis(250);
        }
        if Instant::now() >= next_report {
            let (done, pending, running) = progress(pool).await;
            println!(
                "{}: {:>5.1}s killing: kills={} busy={} done={done} pending={pending} running={running}",
                plan.name,
                started.elapsed().as_secs_f64(),
                stats.kills,
                stats.kills_busy,
            );
            next_report = Instant::now() + Duration::from_secs(5);
        }
    }
}

/// Waits until no turn is queued or running, keeping the fleet up and the sampler on.
pub(super) async fn drain(pool: &PgPool, fleet: &mut Fleet, plan: &Plan, stats: &mut Stats) {
    let started = Instant::now();
    let mut next_report = Instant::now() + Duration::from_secs(5);
    loop {
        stats.restart_crashed(fleet);
        if let Some((dir, required)) = &plan.snipe {
            aim(pool, fleet, dir, *required, stats).await;
        }
        stats.sample(pool).await;
        let (done, pending, running) = progress(pool).await;
        if pending == 0 {
            return;
        }
        if started.elapsed() > plan.drain_timeout {
            let stuck: Vec<String> = sqlx::query_scalar(
                "SELECT format('turn %s %s state=%s attempts=%s run_at=%s worker=%s error=%s | lease turn=%s owner=%s token=%s expires=%s head=%s head_run_at=%s | now=%s',
                               t.id, t.session_id, t.state, t.attempts, t.run_at, t.worker_id, t.error,
                               l.turn_id, l.owner, l.fencing_token, l.expires_at, l.head_turn_id, l.head_run_at, now())
                   FROM turns t LEFT JOIN session_locks l USING (session_id)
                  WHERE t.state IN ('queued', 'running') ORDER BY t.id LIMIT 40",
            )
            .fetch_all(pool)
            .await
            .unwrap();
            panic!(
                "{}: {pending} turns still pending ({running} running, {done} done) {:?} after the killing stopped:\n{}\nworker logs: {}",
                plan.name,
                plan.drain_timeout,
                stuck.join("\n"),
                fleet.log_dir.display()
            );
        }
        if Instant::now() >= next_report {
            println!(
                "{}: {:>5.1}s draining: done={done} pending={pending} running={running}",
                plan.name,
                started.elapsed().as_secs_f64()
            );
            next_report = Instant::now() + Duration::from_secs(5);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

// ---------------------------------------------------------------------------------------
// Verification

#[derive(sqlx::FromRow)]
pub(super) struct TurnRow {
    pub(super) id: i64,
    pub(super) session_id: String,
    pub(super) state: String,
    pub(super) attempts: i32,
    pub(super) message: String,
    pub(super) reply: Option<String>,
    pub(super) error: Option<String>,
    pub(super) echo_ok: bool,
    pub(super) users: i64,
    pub(super) assistants: i64,
    pub(super) users_ok: i64,
    pub(super) assistants_ok: i64,
    pub(super) ok_logs: i64,
    pub(super) ok_attempt: Option<i32>,
}

/// An OK `turn_log` row: session, turn, started, finished, worker.
pub(super) type LogSpan = (String, i64, DateTime<Utc>, DateTime<Utc>, String);

#[derive(Default)]
pub(super) struct Verdict {
    pub(super) turns: usize,
    pub(super) not_done: Vec<String>,
    pub(super) duplicates: Vec<String>,
    pub(super) missing: Vec<String>,
    pub(super) wrong_content: Vec<String>,
    pub(super) order_violations: Vec<String>,
    pub(super) overlaps: Vec<String>,
    pub(super) retried: usize,
    pub(super) max_attempts: i32,
    pub(super) failed_logs: i64,
}

impl Verdict {
    pub(super) fn problems(&self) -> Vec<(&'static str, &Vec<String>)> {
        [
            ("not done", &self.not_done),
            ("duplicates", &self.duplicates),
            ("missing", &self.missing),
            ("wrong content", &self.wrong_content),
            ("order violations", &self.order_violations),
            ("overlaps", &self.overlaps),
        ]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .collect()
    }
}

pub(super) fn push(list: &mut Vec<String>, item: String) {
    if list.len() < 1000 {
        list.push(item);
    }
}

/// Reads the whole outcome back. `expected` is each session's messages in enqueue order.
pub(super) async fn verify(
    pool: &PgPool,
    expected: &BTreeMap<String, Vec<String>>,
    echo: bool,
) -> Verdict {
    let mut v = Verdict::default();
    let rows: Vec<TurnRow> = sqlx::query_as(
        "SELECT t.id, t.session_id, t.state::text AS state, t.attempts, t.message, t.reply, t.error,
                t.reply IS NOT DISTINCT FROM ('echo: ' || t.message) AS echo_ok,
                (SELECT count(*) FROM messages m WHERE m.turn_id = t.id AND m.role = 'user') AS users,
                (SELECT count(*) FROM messages m WHERE m.turn_id = t.id AND m.role = 'assistant') AS assistants,
                (SELECT count(*) FROM messages m WHERE m.turn_id = t.id AND m.role = 'user'
                    AND m.session_id = t.session_id AND m.content = t.message) AS users_ok,
                (SELECT count(*) FROM messages m WHERE m.turn_id = t.id AND m.role = 'assistant'
                    AND m.session_id = t.session_id AND m.content = t.reply) AS assistants_ok,
                (SELECT count(*) FROM turn_log l WHERE l.turn_id = t.id AND l.status = 'OK') AS ok_logs,
                (SELECT max(l.attempt) FROM turn_log l WHERE l.turn_id = t.id AND l.status = 'OK') AS ok_attempt
           FROM turns t ORDER BY t.id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    v.turns = rows.len();

    // Every enqueued message is there, once, in enqueue order.
    let mut by_session: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for r in &rows {
        by_session
            .entry(r.session_id.as_str())
            .or_default()
            .push(r.message.as_str());
    }
    for (sid, msgs) in expected {
        let got = by_session.remove(sid.as_str()).unwrap_or_default();
        if got != *msgs {
            push(
                &mut v.missing,
                format!("session {sid}: turns by id hold {got:?}, enqueued {msgs:?}"),
            );
        }
    }
    for sid in by_session.keys() {
        push(&mut v.missing, format!("unexpected session {sid}"));
    }

    for r in &rows {
        let who = format!("turn {} ({})", r.id, r.session_id);
        if r.state != "done" {
            push(
                &mut v.not_done,
                format!(
                    "{who}: {} after {} attempts, error {:?}",
                    r.state, r.attempts, r.error
                ),
            );
        }
        // Two messages rows per turn are ruled out by UNIQUE (turn_id, role); what can go
        // wrong is a second successful attempt: a second OK log row (checked here) or one
        // whose attempt is not the last (below).
        if r.ok_logs > 1 {
            push(
                &mut v.duplicates,
                format!("{who}: {} OK turn_log rows", r.ok_logs),
            );
        }
        if r.reply.is_none() || r.users == 0 || r.assistants == 0 || r.ok_logs == 0 {
            push(
                &mut v.missing,
                format!(
                    "{who}: reply {:?}, {} user rows, {} assistant rows, {} OK turn_log rows",
                    r.reply, r.users, r.assistants, r.ok_logs
                ),
            );
        }
        if r.users_ok != r.users || r.assistants_ok != r.assistants || (echo && !r.echo_ok) {
            push(
                &mut v.wrong_content,
                format!("{who}: message {:?}, reply {:?}", r.message, r.reply),
            );
        }
        if r.ok_attempt.is_some_and(|a| a != r.attempts) {
            push(
                &mut v.duplicates,
                format!(
                    "{who}: the OK attempt is {:?} but the turn counts {} attempts (claimed again after success?)",
                    r.ok_attempt, r.attempts
                ),
            );
        }
        if r.attempts > 1 {
            v.retried += 1;
        }
        v.max_attempts = v.max_attempts.max(r.attempts);
    }
    let messages: i64 = sqlx::query_scalar("SELECT count(*) FROM messages")
        .fetch_one(pool)
        .await
        .unwrap();
    if messages != 2 * rows.len() as i64 {
        push(
            &mut v.duplicates,
            format!("messages holds {messages} rows for {} turns", rows.len()),
        );
    }
    v.failed_logs = sqlx::query_scalar("SELECT count(*) FROM turn_log WHERE status <> 'OK'")
        .fetch_one(pool)
        .await
        .unwrap();

    // Order and overlap on successful attempts: the turn_log rows ...
    let logs: Vec<LogSpan> = sqlx::query_as(
        "SELECT sid, turn_id, started_at, finished_at, worker_id FROM turn_log
          WHERE status = 'OK' ORDER BY sid, started_at, id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    for pair in logs.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if a.0 != b.0 {
            continue;
        }
        if b.1 <= a.1 {
            push(
                &mut v.order_violations,
                format!(
                    "session {}: turn {} started {} (by {}) after turn {} started {} (by {})",
                    a.0, b.1, b.2, b.4, a.1, a.2, a.4
                ),
            );
        }
        if b.2 < a.3 {
            push(
                &mut v.overlaps,
                format!(
                    "session {}: turn {} (by {}) ran {}..{}, turn {} (by {}) started {}",
                    a.0, a.1, a.4, a.2, a.3, b.1, b.4, b.2
                ),
            );
        }
    }
    // ... and the dialogue in commit order.
    let dialogue: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT session_id, turn_id, id FROM messages WHERE role = 'assistant' ORDER BY session_id, id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    for pair in dialogue.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if a.0 == b.0 && b.1 <= a.1 {
            push(
                &mut v.order_violations,
                format!(
                    "session {}: reply to turn {} (message {}) committed after turn {} (message {})",
                    a.0, b.1, b.2, a.1, a.2
                ),
            );
        }
    }
    v
}

pub(super) fn assert_clean(name: &str, v: &Verdict, stats: &Stats, stop_complaints: &[String]) {
    let mut report = String::new();
    for (what, items) in v.problems() {
        report.push_str(&format!("\n{what} ({}):\n", items.len()));
        for item in items.iter().take(20) {
            report.push_str(&format!("  {item}\n"));
        }
    }
    if !stats.violations.is_empty() {
        report.push_str(&format!(
            "\nqueue invariant violations seen by the sampler ({}):\n",
            stats.violations.len()
        ));
        for item in stats.violations.iter().take(20) {
            report.push_str(&format!("  {item}\n"));
        }
    }
    for item in stats.crashes.iter().chain(stop_complaints) {
        report.push_str(&format!("\n{item}\n"));
    }
    assert!(report.is_empty(), "{name}: the promise broke:{report}");
}

pub(super) fn summary(
    name: &str,
    seed: u64,
    stats: &Stats,
    v: &Verdict,
    started: Instant,
) -> String {
    format!(
        "{name}: seed={seed} kills={} (timed={} mid-snapshot-write={}/{} after-save-before-commit={}/{}) kills_with_running_turn={} \
         turns_stranded={} turns_checked={} retried={} max_attempts={} failed_attempt_logs={} \
         duplicates={} lost={} order_violations={} overlaps={} invariant_violations={} crashes={} \
         sigterm_while_starting={} samples={} elapsed={:.1}s",
        stats.kills,
        stats.timer_kills,
        stats.snipes_mid_write,
        stats.snipes,
        stats.post_save_before_commit,
        stats.post_save,
        stats.kills_busy,
        stats.stranded,
        v.turns,
        v.retried,
        v.max_attempts,
        v.failed_logs,
        v.duplicates.len(),
        v.missing.len() + v.not_done.len(),
        v.order_violations.len(),
        v.overlaps.len(),
        stats.violations.len(),
        stats.crashes.len(),
        stats.sigterm_while_starting,
        stats.samples,
        started.elapsed().as_secs_f64()
    )
}

/// Successful attempts by how they started: warm, or cold with the reason (numbers elided).
pub(super) async fn starts(pool: &PgPool, turns: Option<&[i64]>) -> BTreeMap<String, i64> {
    sqlx::query_as::<_, (String, i64)>(
        "SELECT CASE WHEN loaded THEN 'warm'
                     ELSE 'cold: ' || split_part(regexp_replace(coalesce(cold_reason, '?'), '[0-9]+', 'N', 'g'), ',', 1)
                END, count(*)
           FROM turn_log WHERE status = 'OK' AND ($1::bigint[] IS NULL OR turn_id = ANY($1))
          GROUP BY 1",
    )
    .bind(turns)
    .fetch_all(pool)
    .await
    .unwrap()
    .into_iter()
    .collect()
}

pub(super) async fn prepare(pool: &PgPool, users: usize) -> Vec<(String, i64)> {
    migrate(pool).await;
    sqlx::query("UPDATE kvmem_config SET value = '100' WHERE key = 'max_attempts'")
        .execute(pool)
        .await
        .unwrap();
    let mut owners = Vec::new();
    for u in 0..users {
        let user = format!("u{u}");
        let ch = character(pool, &user, &format!("Pilot {u}")).await;
        owners.push((user, ch));
    }
    owners
}

// ---------------------------------------------------------------------------------------
// The tests
