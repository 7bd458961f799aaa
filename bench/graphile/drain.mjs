#!/usr/bin/env node
// graphile-worker as a reference peer for jobtui's drain benchmark (see README.md).
//
//   node drain.mjs --dsn URL [--mode drain|latency] [--jobs N] [--workers P]
//                  [--concurrency C] [--batch] [--local-queue SIZE] [--complete-delay MS]
//                  [--latency-jobs 300] [--interval-ms 10] [--timeout S]
//
// The database of --dsn must be empty (fresh): graphile-worker's schema is installed
// into it. Prints one JSON line. A drain still running after --timeout seconds reports
// the jobs finished by then, with "capped": true.
// @ts-check
import { fork } from "node:child_process";
import { readFileSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";
import { parseArgs } from "node:util";
import { Logger, makeWorkerUtils, runMigrations } from "graphile-worker";
import pg from "pg";

/** @typedef {import("node:child_process").ChildProcess} Child */
/** @typedef {NonNullable<GraphileConfig.Preset["worker"]>} WorkerOptions */

const VERSION = JSON.parse(
  readFileSync(new URL("../package.json", import.meta.resolve("graphile-worker")), "utf8"),
).version;
const POLL_MS = 20;
const ADD_CHUNK = 50_000;

const logger = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") console.error(`[drain] ${level}: ${message}`);
});

/** @type {Child[]} */
const children = [];
const t0 = performance.now();
/** Progress on stderr, seconds since start. @param {string} what */
const note = (what) => console.error(`[drain ${((performance.now() - t0) / 1000).toFixed(1)}s] ${what}`);

function parse() {
  const { values } = parseArgs({
    options: {
      dsn: { type: "string" },
      mode: { type: "string", default: "drain" },
      jobs: { type: "string", default: "20000" },
      workers: { type: "string", default: "2" },
      concurrency: { type: "string", default: "1" },
      batch: { type: "boolean", default: false },
      "local-queue": { type: "string" },
      "complete-delay": { type: "string" },
      "latency-jobs": { type: "string", default: "300" },
      "interval-ms": { type: "string", default: "10" },
      timeout: { type: "string", default: "600" },
    },
  });
  if (!values.dsn) throw new Error("--dsn is required");
  if (values.mode !== "drain" && values.mode !== "latency") throw new Error("--mode is drain or latency");
  /** @param {string | undefined} s */
  const num = (s) => (s === undefined ? undefined : Number(s));
  return {
    dsn: values.dsn,
    mode: values.mode,
    jobs: Number(values.jobs),
    workers: Number(values.workers),
    concurrency: Number(values.concurrency),
    batch: Boolean(values.batch),
    localQueue: num(values["local-queue"]),
    completeDelay: num(values["complete-delay"]),
    latencyJobs: Number(values["latency-jobs"]),
    intervalMs: Number(values["interval-ms"]),
    timeoutMs: Number(values.timeout) * 1000,
  };
}

/**
 * graphile-worker's options for each process. Without --batch: the library's defaults
 * (no local queue, jobs completed one statement each). With --batch: the settings of its
 * documented performance test (docs/performance): localQueue 500 and complete/fail
 * batching with a 0 ms window.
 * @param {ReturnType<typeof parse>} o
 * @returns {WorkerOptions}
 */
function workerOptions(o) {
  /** @type {WorkerOptions} */
  const w = { concurrentJobs: o.concurrency, maxPoolSize: Math.max(10, o.concurrency + 2) };
  if (o.batch) Object.assign(w, { localQueue: { size: 500 }, completeJobBatchDelay: 0, failJobBatchDelay: 0 });
  if (o.localQueue !== undefined) w.localQueue = { size: o.localQueue };
  if (o.completeDelay !== undefined) w.completeJobBatchDelay = w.failJobBatchDelay = o.completeDelay;
  return w;
}

/** @param {number} processes @param {WorkerOptions} w */
function describe(processes, w) {
  return (
    `${processes} processes x concurrentJobs ${w.concurrentJobs}, maxPoolSize ${w.maxPoolSize}, ` +
    `localQueue.size ${w.localQueue?.size ?? -1}, completeJobBatchDelay ${w.completeJobBatchDelay ?? -1}, ` +
    `failJobBatchDelay ${w.failJobBatchDelay ?? -1}`
  );
}

/** Resolves when `child` sends a message of this type; rejects if it exits first.
 * @param {Child} child @param {string} type @returns {Promise<void>} */
function message(child, type) {
  return new Promise((resolve, reject) => {
    const done = () => child.off("message", onMessage).off("exit", onExit);
    /** @param {any} msg */
    function onMessage(msg) {
      if (msg?.type !== type) return;
      done();
      resolve();
    }
    /** @param {number | null} code */
    function onExit(code) {
      done();
      reject(new Error(`worker ${child.pid} exited (${code}) before '${type}'`));
    }
    child.on("message", onMessage).on("exit", onExit);
  });
}

/** Forks the worker processes and, once all have loaded graphile-worker, starts them at
 * once (so module loading does not stagger them). `ready`: all are listening for jobs.
 * @param {number} count @param {object} config @returns {Promise<{ready: Promise<void[]>}>} */
async function startWorkers(count, config) {
  for (let i = 0; i < count; i++) {
    children.push(fork(new URL("./worker.mjs", import.meta.url), [], { env: { ...process.env, NO_LOG_SUCCESS: "1" } }));
  }
  await Promise.all(children.map((c) => message(c, "loaded")));
  const ready = Promise.all(children.map((c) => message(c, "ready")));
  ready.catch(() => {}); // drain mode does not wait for it; a dead worker is caught by the poll
  for (const c of children) c.send({ type: "go", config });
  return { ready };
}

async function stopWorkers() {
  await Promise.all(
    children.map(async (c) => {
      if (c.exitCode !== null || !c.connected) return;
      const exited = new Promise((resolve) => c.once("exit", resolve));
      c.send({ type: "stop" });
      if ((await Promise.race([exited, sleep(20_000, "timeout", { ref: false })])) === "timeout") c.kill();
    }),
  );
}

/** Installs graphile-worker's schema; the database must hold no jobs yet.
 * @param {string} dsn @param {pg.Client} db */
async function prepare(dsn, db) {
  await runMigrations({ connectionString: dsn, logger });
  const { rows } = await db.query("SELECT count(*)::int AS n FROM graphile_worker._private_jobs");
  if (rows[0].n !== 0) throw new Error(`the database already holds ${rows[0].n} jobs; give a fresh one`);
}

/** @param {ReturnType<typeof parse>} o @param {pg.Client} db */
async function drain(o, db) {
  for (let added = 0; added < o.jobs; added += ADD_CHUNK) {
    await db.query(
      `SELECT count(*) FROM graphile_worker.add_jobs(ARRAY(
         SELECT ROW('noop', NULL, NULL, NULL, NULL, NULL, NULL, NULL)::graphile_worker.job_spec
         FROM generate_series(1, $1::int)))`,
      [Math.min(ADD_CHUNK, o.jobs - added)],
    );
  }
  note(`${o.jobs} jobs added`);
  await db.query("VACUUM ANALYZE");
  note("vacuumed; starting workers");

  const w = workerOptions(o);
  await startWorkers(o.workers, { dsn: o.dsn, latency: false, preset: { worker: w } });
  const deadline = Date.now() + o.timeoutMs;
  /** @type {number | null} */
  let first = null;
  for (;;) {
    const { rows } = await db.query(
      `SELECT count(*)::int AS left, extract(epoch FROM clock_timestamp())::float8 AS at
       FROM graphile_worker._private_jobs`,
    );
    const { left, at } = rows[0];
    if (first === null && left < o.jobs) first = at;
    const capped = left > 0 && Date.now() > deadline;
    if (left === 0 || capped) {
      if (first === null || at === first) {
        throw new Error(capped ? `timed out with ${left} jobs left` : "drained within one poll; use more --jobs");
      }
      note(capped ? `timed out with ${left} jobs left` : "drained");
      const [jobs, seconds] = [o.jobs - left, at - first];
      return {
        jobs,
        seconds: round(seconds, 3),
        rate: round(jobs / seconds, 1),
        capped,
        first_at: first,
        last_at: at,
        version: VERSION,
        settings: describe(o.workers, w),
      };
    }
    const dead = children.find((c) => c.exitCode !== null);
    if (dead) throw new Error(`worker ${dead.pid} exited (${dead.exitCode}) with ${left} jobs left`);
    await sleep(POLL_MS);
  }
}

/** @param {ReturnType<typeof parse>} o @param {pg.Client} db */
async function latency(o, db) {
  await db.query("CREATE TABLE bench_latency (job_id bigint PRIMARY KEY, started timestamptz NOT NULL)");
  const w = workerOptions(o);
  await (await startWorkers(o.workers, { dsn: o.dsn, latency: true, preset: { worker: w } })).ready;
  note("workers ready");

  // timestamptz as PostgreSQL's text, so created_at keeps its microseconds (a Date would not)
  /** @type {any} */
  const types = {
    getTypeParser: (/** @type {number} */ oid, /** @type {any} */ format) =>
      oid === pg.types.builtins.TIMESTAMPTZ ? (/** @type {string} */ v) => v : pg.types.getTypeParser(oid, format),
  };
  const pool = new pg.Pool({ connectionString: o.dsn, max: 1, types });
  pool.on("error", (err) => logger.error(`enqueue pool: ${err.message}`));
  pool.on("connect", (client) => client.on("error", (err) => logger.error(`enqueue client: ${err.message}`)));
  const utils = await makeWorkerUtils({ pgPool: pool, logger });
  try {
    await utils.addJob("noop", {}); // warm-up, not measured
    await sleep(500);
    /** @type {string[]} */ const ids = [];
    /** @type {string[]} */ const created = [];
    const start = performance.now();
    for (let i = 0; i < o.latencyJobs; i++) {
      const wait = start + i * o.intervalMs - performance.now();
      if (wait > 0) await sleep(wait);
      const job = await utils.addJob("noop", {});
      ids.push(job.id);
      created.push(String(job.created_at));
    }
    const deadline = Date.now() + 30_000;
    for (;;) {
      const { rows } = await db.query(
        `SELECT extract(epoch FROM l.started - t.created_at)::float8 * 1000 AS ms
         FROM unnest($1::bigint[], $2::timestamptz[]) AS t(id, created_at)
         JOIN bench_latency AS l ON l.job_id = t.id`,
        [ids, created],
      );
      if (rows.length === ids.length || Date.now() > deadline) {
        const ms = rows.map((r) => r.ms).sort((a, b) => a - b);
        return {
          jobs: ms.length,
          p50_ms: round(quantile(ms, 0.5), 2),
          p99_ms: round(quantile(ms, 0.99), 2),
          version: VERSION,
          settings: `${describe(o.workers, w)}; one addJob every ${o.intervalMs} ms`,
        };
      }
      await sleep(200);
    }
  } finally {
    await utils.release();
    await pool.end();
  }
}

/** Linear interpolation between the closest ranks (Python's statistics.quantiles "inclusive").
 * @param {number[]} sorted @param {number} q */
function quantile(sorted, q) {
  if (sorted.length === 0) return NaN;
  const pos = (sorted.length - 1) * q;
  const lo = Math.floor(pos);
  return sorted[lo] + (sorted[Math.min(lo + 1, sorted.length - 1)] - sorted[lo]) * (pos - lo);
}

/** @param {number} x @param {number} digits */
const round = (x, digits) => Math.round(x * 10 ** digits) / 10 ** digits;

async function main() {
  const o = parse();
  // Named, so that bench/peers.py leaves this connection (its enqueues and polls) out of the
  // server CPU it reads for the workers' backends.
  const db = new pg.Client({ connectionString: o.dsn, application_name: "jobtui-bench-observer" });
  await db.connect();
  try {
    await prepare(o.dsn, db);
    note("schema installed");
    const result = o.mode === "drain" ? await drain(o, db) : await latency(o, db);
    await stopWorkers();
    note("workers stopped");
    console.log(JSON.stringify(result));
  } finally {
    await db.end();
  }
}

main().catch((err) => {
  console.error(err instanceof Error ? err.message : err);
  for (const c of children) if (c.exitCode === null) c.kill();
  process.exitCode = 1;
});
