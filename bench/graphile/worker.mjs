// One graphile-worker process, forked by drain.mjs (talks to it over IPC only).
//
// Messages from the parent: {type: "go", config} then {type: "stop"}.
// Messages to the parent:   {type: "loaded"}, {type: "ready"}; it exits once stopped.
// @ts-check
import { EventEmitter } from "node:events";
import { Logger, run } from "graphile-worker";

/**
 * @typedef {object} WorkerConfig
 * @property {string} dsn
 * @property {boolean} latency  record each job's start in bench_latency
 * @property {GraphileConfig.Preset} preset  graphile-worker options (preset.worker)
 */

/** Warnings and errors only: no line per job, so the drain is not a console benchmark. */
const logger = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") console.error(`[worker ${process.pid}] ${level}: ${message}`);
});

/** @param {object} msg */
const send = (msg) => process.send?.(msg);

/** @type {import("graphile-worker").Runner | undefined} */
let runner;

/** @param {WorkerConfig} config */
async function start(config) {
  /** @type {import("graphile-worker").TaskList} */
  const taskList = config.latency
    ? {
        noop: async (_payload, helpers) => {
          await helpers.query("INSERT INTO bench_latency (job_id, started) VALUES ($1, clock_timestamp())", [
            helpers.job.id,
          ]);
        },
      }
    : { noop: async () => {} };
  const events = new EventEmitter();
  events.once("pool:listen:success", () => send({ type: "ready" }));
  runner = await run({
    connectionString: config.dsn,
    logger,
    events,
    taskList,
    parsedCronItems: [], // no crontab file lookup
    preset: config.preset,
  });
  runner.promise.catch((err) => {
    console.error(`[worker ${process.pid}] runner failed:`, err);
    process.exit(1);
  });
}

async function stop() {
  await runner?.stop(); // graceful: flushes batched completions, releases the pool
  process.exit(0); // the IPC channel alone would keep the process alive
}

process.on("message", (/** @type {{type: string, config?: WorkerConfig}} */ msg) => {
  const step = msg.type === "go" && msg.config ? start(msg.config) : msg.type === "stop" ? stop() : undefined;
  step?.catch((err) => {
    console.error(`[worker ${process.pid}]`, err);
    process.exit(1);
  });
});
// An orphan (the parent killed) would otherwise run on, reconnecting to a dropped database.
process.on("disconnect", () => process.exit(1));
send({ type: "loaded" });
