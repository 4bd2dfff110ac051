#!/usr/bin/env node
// Benchmark of graphile-worker (the peer queue kvmem is compared with).
//
// Workload: S sessions x J jobs; the jobs of one session must run one at a time, in
// order. In graphile-worker that is a named (serial) queue per session:
// queue_name = session id. The task is a no-op.
//
//   node bench.mjs --url postgres://... [--sessions 1000] [--jobs 10] [--concurrency 4]
//                  [--mode default|fast] [--schema graphile_worker_bench_x]
//                  [--timeout 300] [--stall-timeout 60] [--latency-jobs 500]
//                  [--latency-gap-ms 5] [--enqueue rounds|batch] [--batch-size 5000]
//
// Phases:
//   1. drop + migrate a dedicated schema;
//   2. enqueue all S*J jobs with addJobs (reported as enqueue_s);
//   3. start a worker (library run()) and time it until every job is complete;
//   4. with the worker idle, add --latency-jobs single jobs, each to a fresh queue,
//      --latency-gap-ms apart, and measure add-to-start latency (the NOTIFY path);
//   5. stop the worker and drop the schema.
//
// The last line of stdout is one JSON object; everything else goes to stderr.
//
// Definitions:
//   run_s         worker start (just before run()) -> the last completion committed
//                 (the DELETE of the last job acknowledged by Postgres).
//   jobs_per_s    total / run_s.
//   latency_*     phase 4: job start - time just before addJob() was called.
//   backlog_latency_*  phase 3: job start - the moment it became runnable, i.e.
//                 max(worker start, the previous job of its session returned from
//                 its task function). Includes Worker's completion + refetch cost.
//   order_violations   per session, adjacent starts whose index is not previous+1
//                 (counts reorders, duplicates and gaps).
//   overlaps      job k of a session started before the completion of job k-1 had
//                 even been sent to Postgres (so k ran while k-1 still held the
//                 queue). Completion sends are seen by wrapping pg.Client.query.
//
// enqueue=rounds (default) adds job index 0 of every session in one transaction,
// then index 1, ... Worker orders a queue by (priority, run_at) and run_at defaults
// to now() (the transaction start), so jobs of one session added in the same
// transaction would have equal run_at and no defined order. enqueue=batch does that
// (session-major chunks of --batch-size) to show the effect.

import { createRequire } from "node:module";
import { performance } from "node:perf_hooks";
import { EventEmitter } from "node:events";

// Nothing but the final JSON goes to stdout.
console.log = console.error;
console.info = console.error;

const require = createRequire(import.meta.url);
const { run, makeWorkerUtils, Logger } = require("graphile-worker");
const GW_VERSION = require("graphile-worker/package.json").version;
const pg = require("pg");

const now = () => performance.timeOrigin + performance.now(); // ms, sub-ms precision
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const log = (...a) => console.error("[bench-graphile]", ...a);

// ---------------------------------------------------------------- arguments
function parseArgs(argv) {
  const o = {
    url: process.env.DATABASE_URL || "",
    sessions: 1000,
    jobs: 10,
    concurrency: 4,
    mode: "default",
    schema: `graphile_worker_bench_${process.pid}_${Math.floor(Math.random() * 1e6)}`,
    timeout: 300,
    "stall-timeout": 60,
    "latency-jobs": 500,
    "latency-gap-ms": 5,
    enqueue: "rounds",
    "batch-size": 5000,
    "max-pool-size": 0,
  };
  for (let i = 0; i < argv.length; i++) {
    let a = argv[i];
    if (a === "-h" || a === "--help") {
      console.error(
        "usage: bench.mjs --url URL [--sessions N] [--jobs N] [--concurrency N] [--mode default|fast]\n" +
          "                 [--schema graphile_worker_bench_X] [--timeout S] [--stall-timeout S]\n" +
          "                 [--latency-jobs N] [--latency-gap-ms MS] [--enqueue rounds|batch]\n" +
          "                 [--batch-size N] [--max-pool-size N]",
      );
      process.exit(2);
    }
    if (!a.startsWith("--")) throw new Error(`unexpected argument: ${a}`);
    a = a.slice(2);
    let v;
    const eq = a.indexOf("=");
    if (eq >= 0) {
      v = a.slice(eq + 1);
      a = a.slice(0, eq);
    } else {
      v = argv[++i];
    }
    if (!(a in o)) throw new Error(`unknown option --${a}`);
    if (v === undefined) throw new Error(`--${a} needs a value`);
    o[a] = typeof o[a] === "number" ? Number(v) : v;
    if (typeof o[a] === "number" && !Number.isFinite(o[a])) throw new Error(`--${a}: not a number: ${v}`);
  }
  if (!o.url) throw new Error("--url (or DATABASE_URL) is required");
  if (!["default", "fast"].includes(o.mode)) throw new Error("--mode must be default or fast");
  if (!["rounds", "batch"].includes(o.enqueue)) throw new Error("--enqueue must be rounds or batch");
  // The schema is dropped (cascade) before and after: refuse anything but a bench schema.
  if (!/^graphile_worker_bench[a-z0-9_]*$/.test(o.schema) || o.schema.length > 63)
    throw new Error("--schema must match ^graphile_worker_bench[a-z0-9_]*$ (max 63 chars)");
  for (const k of ["sessions", "jobs", "concurrency", "batch-size"])
    if (!(Number.isInteger(o[k]) && o[k] >= 1)) throw new Error(`--${k} must be a positive integer`);
  if (!(Number.isInteger(o["latency-jobs"]) && o["latency-jobs"] >= 0))
    throw new Error("--latency-jobs must be an integer >= 0");
  return o;
}

function pct(sorted, p) {
  if (sorted.length === 0) return null;
  const k = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[k];
}
const r3 = (x) => (x == null || !Number.isFinite(x) ? null : Math.round(x * 1000) / 1000);

// ---------------------------------------------------------------- main
const opts = parseArgs(process.argv.slice(2));
const t_script = now();
const deadline = t_script + opts.timeout * 1000;
const SCHEMA = opts.schema;
const QS = `"${SCHEMA}"`;
const APP = `gwbench_${SCHEMA}`.slice(0, 63);
const S = opts.sessions;
const J = opts.jobs;
const TOTAL = S * J;

// Connection string with an application_name, so a hung run's backends can be found.
const connUrl = (() => {
  try {
    const u = new URL(opts.url);
    u.searchParams.set("application_name", APP);
    return u.toString();
  } catch {
    return opts.url;
  }
})();

const result = {
  tool: "graphile-worker",
  version: GW_VERSION,
  mode: opts.mode,
  sessions: S,
  jobs: J,
  concurrency: opts.concurrency,
  total: TOTAL,
  enqueue_s: null,
  run_s: null,
  jobs_per_s: null,
  order_violations: null,
  overlaps: null,
  latency_p50_ms: null,
  latency_p99_ms: null,
  latency_n: 0,
  hung: false,
  completed: 0,
};
const extra = {}; // printed after the required fields

// ---- instrumentation: when is each job's completion sent / acknowledged?
const completionSent = new Map(); // job id -> ms
const completionAck = new Map(); // job id -> ms
function idsFromCompletion(cfg) {
  if (!cfg || typeof cfg !== "object" || !Array.isArray(cfg.values)) return null;
  const name = typeof cfg.name === "string" ? cfg.name : "";
  const text = typeof cfg.text === "string" ? cfg.text : "";
  if (!(name.startsWith("complete_job") || /^\s*(with j as \(\s*)?delete from .*_private_jobs/is.test(text)))
    return null;
  const v = cfg.values[0];
  return (Array.isArray(v) ? v : [v]).map(String);
}
// Fetches ("get_job..." statements): how many jobs were fetched, and how many of
// them shared a named queue with another job of the same fetch (Worker's invariant is
// one job in flight per locked queue; see graphile/worker#621 about localQueue).
const fetchStats = { fetches: 0, jobs: 0, sameQueueInFetch: 0 };
function isFetch(cfg) {
  return cfg && typeof cfg === "object" && typeof cfg.name === "string" && cfg.name.startsWith("get_job");
}
class TracingClient extends pg.Client {
  query(config, values, callback) {
    const ids = idsFromCompletion(config);
    const ret = super.query(config, values, callback);
    if (isFetch(config) && ret && typeof ret.then === "function") {
      ret.then(
        (res) => {
          const rows = res?.rows ?? [];
          fetchStats.fetches++;
          fetchStats.jobs += rows.length;
          const seen = new Set();
          for (const r of rows) {
            if (r.job_queue_id == null) continue;
            const q = String(r.job_queue_id);
            if (seen.has(q)) fetchStats.sameQueueInFetch++;
            else seen.add(q);
          }
        },
        () => {},
      );
    }
    if (ids) {
      const t = now();
      for (const id of ids) if (!completionSent.has(id)) completionSent.set(id, t);
      if (ret && typeof ret.then === "function") {
        ret.then(
          () => {
            const ta = now();
            for (const id of ids) {
              if (completionAck.has(id)) continue;
              completionAck.set(id, ta);
              if (backlog.has(id)) backlogAcked++;
            }
            lastProgress = ta;
          },
          () => {},
        );
      }
    }
    return ret;
  }
}

const maxPool = opts["max-pool-size"] > 0 ? opts["max-pool-size"] : Math.max(10, opts.concurrency + 2);
const pool = new pg.Pool({ connectionString: connUrl, max: maxPool, Client: TracingClient });
pool.on("error", (e) => log("pg pool error:", e.message));
pool.on("connect", (client) => client.on("error", (e) => log("pg client error:", e.message)));

// Quiet logger: Worker logs every completed job at info level; keep warnings/errors.
const logger = new Logger((scope) => (level, message) => {
  if (level === "error" || level === "warning") console.error(`[graphile-worker ${level}]`, message);
});

// ---- per-job records
const backlog = new Map(); // job id -> {s, i, start, end}
const bySession = new Map(); // session -> array of records in start order
const runs = new Map(); // job id -> times run (duplicates)
let backlogDone = 0; // distinct backlog jobs whose task ran
let backlogAcked = 0; // ... and whose completion Postgres acknowledged
let lastProgress = now();
const latency = []; // {i, t, start}
let latencyDone = 0;

const taskList = {
  noop: async (payload, helpers) => {
    const start = now();
    const id = String(helpers.job.id);
    runs.set(id, (runs.get(id) || 0) + 1);
    if (payload && payload.lat) {
      latency.push({ i: payload.i, t: payload.t, start });
      latencyDone++;
    } else {
      const rec = { id, s: payload.s, i: payload.i, t: payload.t, start, end: 0 };
      let arr = bySession.get(payload.s);
      if (!arr) bySession.set(payload.s, (arr = []));
      arr.push(rec);
      if (runs.get(id) === 1) backlogDone++;
      backlog.set(id, rec);
      rec.end = now(); // the no-op
    }
    lastProgress = now();
  },
};

let runner = null;
let utils = null;
let runnerEnded = null; // set when runner.promise settles on its own

async function adminQuery(sql, timeoutMs = 30000) {
  const c = new pg.Client({ connectionString: connUrl });
  await c.connect();
  try {
    await c.query(`set statement_timeout = ${Math.floor(timeoutMs)}`);
    await c.query(`set lock_timeout = ${Math.floor(timeoutMs)}`);
    return await c.query(sql);
  } finally {
    await c.end().catch(() => {});
  }
}

const withTimeout = (p, ms, what) =>
  Promise.race([
    p,
    sleep(ms).then(() => {
      throw new Error(`${what}: timed out after ${ms} ms`);
    }),
  ]);

// Wait until cond() or a hang: deadline, stall, or the runner ending by itself.
// Polls every 10 ms; all timings come from the recorded timestamps, not from here.
async function waitFor(cond, what) {
  while (!cond()) {
    const t = now();
    if (runnerEnded) return { hung: true, reason: `worker stopped during ${what}: ${runnerEnded}` };
    if (t >= deadline) return { hung: true, reason: `--timeout ${opts.timeout}s reached during ${what}` };
    if (opts["stall-timeout"] > 0 && t - lastProgress > opts["stall-timeout"] * 1000)
      return { hung: true, reason: `no progress for ${opts["stall-timeout"]}s during ${what}` };
    await sleep(10);
  }
  return { hung: false };
}

function analyse(tStart) {
  let orderViolations = 0;
  let overlaps = 0;
  let overlapsTask = 0;
  let missingCompletion = 0;
  const lat = [];
  for (const arr of bySession.values()) {
    // arr is in start order (single Node process, starts are recorded synchronously)
    for (let k = 0; k < arr.length; k++) {
      const cur = arr[k];
      if (k === 0) {
        if (cur.i !== 0) orderViolations++;
        lat.push(cur.start - Math.max(tStart, cur.t));
        continue;
      }
      const prev = arr[k - 1];
      if (cur.i !== prev.i + 1) orderViolations++;
      const sent = completionSent.get(prev.id);
      if (sent === undefined) missingCompletion++;
      if (sent === undefined || cur.start < sent) overlaps++;
      if (cur.start < prev.end) overlapsTask++;
      lat.push(cur.start - Math.max(tStart, cur.t, prev.end));
    }
  }
  lat.sort((a, b) => a - b);
  let dup = 0;
  for (const n of runs.values()) if (n > 1) dup += n - 1;
  return { orderViolations, overlaps, overlapsTask, missingCompletion, lat, dup };
}

async function main() {
  log(`graphile-worker ${GW_VERSION}, node ${process.version}, mode=${opts.mode}, ` +
    `${S} sessions x ${J} jobs, concurrency=${opts.concurrency}, schema=${SCHEMA}, pool max=${maxPool}`);

  // 1. fresh schema + migrations
  await adminQuery(`drop schema if exists ${QS} cascade`);
  const tm = now();
  utils = await makeWorkerUtils({ pgPool: pool, schema: SCHEMA, logger }); // runs the migrations
  await utils.migrate(); // no-op if already done
  log(`migrated in ${((now() - tm) / 1000).toFixed(3)} s`);

  // 2. enqueue everything
  const sid = (n) => `s${n}`;
  const bs = opts["batch-size"];
  const t_enq0 = now();
  let calls = 0;
  if (opts.enqueue === "rounds") {
    for (let i = 0; i < J; i++) {
      for (let s0 = 0; s0 < S; s0 += bs) {
        const specs = [];
        const t = now();
        for (let s = s0; s < Math.min(S, s0 + bs); s++)
          specs.push({ identifier: "noop", payload: { s: sid(s), i, t }, queueName: sid(s) });
        await utils.addJobs(specs);
        calls++;
      }
    }
  } else {
    let specs = [];
    let t = now();
    for (let s = 0; s < S; s++) {
      for (let i = 0; i < J; i++) {
        specs.push({ identifier: "noop", payload: { s: sid(s), i, t }, queueName: sid(s) });
        if (specs.length >= bs) {
          await utils.addJobs(specs);
          calls++;
          specs = [];
          t = now();
        }
      }
    }
    if (specs.length) {
      await utils.addJobs(specs);
      calls++;
    }
  }
  const t_enq1 = now();
  result.enqueue_s = r3((t_enq1 - t_enq0) / 1000);
  extra.enqueue_jobs_per_s = Math.round(TOTAL / ((t_enq1 - t_enq0) / 1000));
  extra.enqueue = opts.enqueue;
  log(`enqueued ${TOTAL} jobs in ${result.enqueue_s} s (${calls} addJobs calls, ${opts.enqueue})`);

  // 3. run the worker
  const preset = {};
  if (opts.mode === "fast") {
    preset.worker = { localQueue: { size: 500 }, completeJobBatchDelay: 0, failJobBatchDelay: 0 };
    extra.settings = "preset.worker: localQueue.size=500, completeJobBatchDelay=0, failJobBatchDelay=0";
  } else {
    extra.settings = "graphile-worker defaults";
  }
  extra.unsupported_options = []; // all three exist in 0.17.3 (checked in dist/index.d.ts)
  const events = new EventEmitter();
  events.on("pool:fatalError", ({ error, action }) => log(`pool:fatalError (${action}):`, error?.message ?? error));
  events.on("worker:fatalError", ({ error }) => log("worker:fatalError:", error?.message ?? error));
  let firstStart = 0;
  events.on("job:start", () => {
    if (!firstStart) firstStart = now();
  });

  lastProgress = now();
  const t0 = now();
  runner = await run({
    pgPool: pool,
    schema: SCHEMA,
    concurrency: opts.concurrency,
    noHandleSignals: true,
    taskList,
    logger,
    events,
    preset,
  });
  runner.promise.then(
    () => {
      runnerEnded ??= "runner exited";
    },
    (e) => {
      runnerEnded ??= `runner failed: ${e?.message ?? e}`;
    },
  );
  log(`run() returned after ${(now() - t0).toFixed(1)} ms`);

  const w1 = await waitFor(
    () => backlogDone >= TOTAL && backlogAcked >= TOTAL,
    "the backlog",
  );
  result.completed = backlogDone;
  extra.completed_committed = backlogAcked;
  if (w1.hung) {
    result.hung = true;
    extra.hung_reason = w1.reason;
    log(`HUNG: ${w1.reason}; ${backlogDone}/${TOTAL} jobs ran`);
    const a = analyse(t0);
    result.order_violations = a.orderViolations;
    result.overlaps = a.overlaps;
    return;
  }
  let tEnd = 0;
  let tTasks = 0;
  for (const [id, rec] of backlog) {
    tEnd = Math.max(tEnd, completionAck.get(id));
    tTasks = Math.max(tTasks, rec.end);
  }
  const runS = (tEnd - t0) / 1000;
  result.run_s = r3(runS);
  result.jobs_per_s = Math.round(TOTAL / runS);
  extra.tasks_done_s = r3((tTasks - t0) / 1000);
  extra.first_job_after_ms = r3(firstStart - t0);
  const a = analyse(t0);
  result.order_violations = a.orderViolations;
  result.overlaps = a.overlaps;
  extra.overlaps_task_fn = a.overlapsTask;
  extra.fetches = fetchStats.fetches;
  extra.jobs_fetched = fetchStats.jobs;
  extra.same_queue_jobs_in_one_fetch = fetchStats.sameQueueInFetch;
  extra.duplicate_runs = a.dup;
  extra.backlog_latency_p50_ms = r3(pct(a.lat, 50));
  extra.backlog_latency_p99_ms = r3(pct(a.lat, 99));
  extra.backlog_latency_max_ms = r3(a.lat[a.lat.length - 1]);
  log(`backlog: ${TOTAL} jobs in ${result.run_s} s = ${result.jobs_per_s} jobs/s; ` +
    `order violations ${a.orderViolations}, overlaps ${a.overlaps} (task-fn overlaps ${a.overlapsTask}), ` +
    `duplicates ${a.dup}; ${fetchStats.fetches} fetches, ${fetchStats.sameQueueInFetch} jobs fetched ` +
    `together with another job of their queue; start latency p50 ${extra.backlog_latency_p50_ms} ms p99 ${extra.backlog_latency_p99_ms} ms`);

  // 4. latency phase: idle worker, one job at a time, each in its own queue
  const L = opts["latency-jobs"];
  if (L > 0) {
    await sleep(200); // let the pool settle into idle
    lastProgress = now();
    const tl0 = now();
    let addMax = 0;
    for (let i = 0; i < L; i++) {
      const due = tl0 + i * opts["latency-gap-ms"];
      const wait = due - now();
      if (wait > 0) await sleep(wait);
      if (runnerEnded || now() >= deadline) break;
      const t = now();
      await utils.addJob("noop", { lat: true, i, t }, { queueName: `lat${i}` });
      addMax = Math.max(addMax, now() - t);
    }
    const w2 = await waitFor(() => latencyDone >= L, "the latency phase");
    const ls = latency.map((x) => x.start - x.t).sort((x, y) => x - y);
    result.latency_n = ls.length;
    result.latency_p50_ms = r3(pct(ls, 50));
    result.latency_p99_ms = r3(pct(ls, 99));
    extra.latency_max_ms = r3(ls[ls.length - 1]);
    extra.latency_add_job_max_ms = r3(addMax);
    if (w2.hung) {
      result.hung = true;
      extra.hung_reason = w2.reason;
      log(`HUNG: ${w2.reason}; ${latencyDone}/${L} latency jobs ran`);
      return;
    }
    log(`latency: n=${ls.length} p50 ${result.latency_p50_ms} ms p99 ${result.latency_p99_ms} ms max ${extra.latency_max_ms} ms`);
  }
}

async function cleanup() {
  // Stop the worker (bounded: a hung pool may never finish), then drop the schema.
  if (runner) {
    try {
      await withTimeout(runner.stop(), 10000, "runner.stop()");
    } catch (e) {
      log("stop:", e.message);
    }
  }
  if (utils) {
    try {
      await withTimeout(utils.release(), 5000, "utils.release()");
    } catch (e) {
      log("utils.release:", e.message);
    }
  }
  try {
    await withTimeout(pool.end(), 5000, "pool.end()");
  } catch (e) {
    log("pool.end:", e.message);
  }
  try {
    // Anything of ours still connected (after a hang) would block the drop.
    await adminQuery(
      `select pg_terminate_backend(pid) from pg_stat_activity where application_name = '${APP}' and pid <> pg_backend_pid()`,
      10000,
    );
    await adminQuery(`drop schema if exists ${QS} cascade`, 30000);
    log(`dropped schema ${SCHEMA}`);
  } catch (e) {
    log(`could not drop schema ${SCHEMA}:`, e.message);
    extra.schema_left_behind = SCHEMA;
  }
}

let exitCode = 0;
try {
  await main();
} catch (e) {
  log("error:", e?.stack ?? e);
  extra.error = String(e?.message ?? e);
  exitCode = 1;
}
await cleanup();
extra.wall_s = r3((now() - t_script) / 1000);
process.stdout.write(JSON.stringify({ ...result, ...extra }) + "\n", () => process.exit(exitCode));
