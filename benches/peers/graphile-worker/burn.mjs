#!/usr/bin/env node
// Burn-down of no-op jobs on graphile-worker: the peer of tickler's
// PostgreSQL burn-down (`pg_burn_down` in benches/tickler_bench.rs), run
// against the same server so that the two can be compared in one run.
//
//   node burn.mjs [N] [--config NAME[,NAME...]] [--analyze]
//
// N (default 200000) no-op jobs are inserted in bulk (not timed) into a
// fresh database `graphile_bench` on the server named by
// TICKLER_BENCH_DATABASE_URL (else TICKLER_TEST_DATABASE_URL); then one
// graphile-worker runner is started with a no-op task and timed until the
// last job is gone from the jobs table (graphile-worker deletes a job when
// it completes, and keeps a failed one). One JSON line per configuration is
// printed on stdout; everything else goes to stderr.
//
// The configurations (see CONFIGS below and README.md): by default
// `c4_batched` (4 concurrent jobs, like tickler's 4-thread pool, with the
// batching settings of graphile-worker's performance page) and
// `docs_perf_preset` (that page's preset exactly, 24 concurrent jobs).
//
// --analyze runs ANALYZE on the jobs table after the fill (not timed).
// Without it the procedure is tickler's (a fresh database, a bulk fill, no
// ANALYZE); graphile-worker's fetch is then several times slower on a
// large table (its planner has no statistics for the freshly filled
// table: see README.md).

import { EventEmitter } from "node:events";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { performance } from "node:perf_hooks";
import { setTimeout as sleep } from "node:timers/promises";

// As graphile-worker's own perfTest does: no log line per completed job.
// Read when graphile-worker is loaded, hence set before the require below.
process.env.NO_LOG_SUCCESS ??= "1";

const require = createRequire(import.meta.url);
const graphileMain = require.resolve("graphile-worker");
const { run, runMigrations, Logger } = require("graphile-worker");
// The pg that graphile-worker itself uses.
const pg = createRequire(graphileMain)("pg");

const GRAPHILE_VERSION = packageVersion(graphileMain);
const PG_CLIENT_VERSION = packageVersion(createRequire(graphileMain).resolve("pg"));

const DATABASE = "graphile_bench";
const SCHEMA = "graphile_worker";
const FILL_CHUNK = 10_000;
const TIMEOUT_S = Number(process.env.GRAPHILE_BENCH_TIMEOUT_S ?? 600);
const VERBOSE = !!process.env.GRAPHILE_BENCH_VERBOSE;

// Each configuration is exactly the `preset.worker` options given to
// graphile-worker (besides connectionString, schema, logger and events).
const CONFIGS = {
  // tickler's burn-down uses a pool of 4 threads: 4 concurrent jobs, with
  // the batching values of the performance page's preset (local queue of
  // 500, completions and failures batched with a delay of 0 ms); pool of
  // 10 connections, the default and what the docs advise ("10 or
  // concurrentJobs + 2, whichever is larger").
  c4_batched: {
    concurrentJobs: 4,
    maxPoolSize: 10,
    localQueue: { size: 500 },
    completeJobBatchDelay: 0,
    failJobBatchDelay: 0,
  },
  // The performance page's "Quick stats" / "With batching" preset as given
  // (its perfTest runs 4 processes of it; here one process, as tickler).
  docs_perf_preset: {
    concurrentJobs: 24,
    maxPoolSize: 25,
    localQueue: { size: 500 },
    completeJobBatchDelay: 0,
    failJobBatchDelay: 0,
  },
  // Not run by default. The performance page's "starting point" for
  // batching (local queue of concurrentJobs + 1, 25 ms batch delays), at 4.
  c4_docs_starting_point: {
    concurrentJobs: 4,
    maxPoolSize: 10,
    localQueue: { size: 5 },
    completeJobBatchDelay: 25,
    failJobBatchDelay: 25,
  },
  // Not run by default. graphile-worker's defaults (no batching) at 4.
  c4_unbatched: {
    concurrentJobs: 4,
    maxPoolSize: 10,
    localQueue: { size: -1 },
    completeJobBatchDelay: -1,
    failJobBatchDelay: -1,
  },
};
const DEFAULT_CONFIGS = ["c4_batched", "docs_perf_preset"];

function packageVersion(resolvedMain) {
  // Walk up from the resolved entry point to the package's package.json.
  let dir = dirname(resolvedMain);
  for (;;) {
    try {
      const pkg = JSON.parse(readFileSync(join(dir, "package.json"), "utf8"));
      if (pkg.name && pkg.version) return pkg.version;
    } catch {
      // not here
    }
    const up = dirname(dir);
    if (up === dir) return null;
    dir = up;
  }
}

function usage(message) {
  if (message) console.error(`burn.mjs: ${message}`);
  console.error(
    `usage: node burn.mjs [N] [--config NAME[,NAME...]] [--analyze]\n` +
      `  N: jobs to burn down (default 200000)\n` +
      `  --analyze: ANALYZE the jobs table after the fill (not timed)\n` +
      `  configurations: ${Object.keys(CONFIGS).join(", ")} ` +
      `(default ${DEFAULT_CONFIGS.join(",")})\n` +
      `  env: TICKLER_BENCH_DATABASE_URL (or TICKLER_TEST_DATABASE_URL), a PostgreSQL server URL`,
  );
  process.exit(2);
}

function parseArgs(argv) {
  let n = 200_000;
  let configs = DEFAULT_CONFIGS;
  let sawN = false;
  let analyze = false;
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === "-h" || arg === "--help") usage();
    if (arg === "--analyze") {
      analyze = true;
      continue;
    }
    let value = null;
    if (arg === "--config") value = argv[++i];
    else if (arg.startsWith("--config=")) value = arg.slice("--config=".length);
    if (value !== null) {
      if (!value) usage("--config needs a value");
      configs = value.split(",").filter(Boolean);
      for (const c of configs) if (!(c in CONFIGS)) usage(`unknown configuration '${c}'`);
      continue;
    }
    if (!sawN && /^[0-9_]+$/.test(arg)) {
      n = Number(arg.replaceAll("_", ""));
      sawN = true;
      if (!Number.isSafeInteger(n) || n < 1) usage(`bad job count '${arg}'`);
      continue;
    }
    usage(`unexpected argument '${arg}'`);
  }
  return { n, configs, analyze };
}

function serverUrl() {
  const url = process.env.TICKLER_BENCH_DATABASE_URL || process.env.TICKLER_TEST_DATABASE_URL;
  if (!url) {
    console.error(
      "burn.mjs: set TICKLER_BENCH_DATABASE_URL (or TICKLER_TEST_DATABASE_URL) to a PostgreSQL " +
        "server URL, e.g. with `source .ci/postgres` from the repository's root",
    );
    process.exit(2);
  }
  return url;
}

// The same server URL naming another database (as with_dbname in
// benches/tickler_bench.rs).
function withDatabase(url, database) {
  const u = new URL(url);
  u.pathname = `/${database}`;
  return u.toString();
}

async function withClient(connectionString, fn) {
  const client = new pg.Client({ connectionString });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

async function freshDatabase(server) {
  await withClient(server, async (admin) => {
    await admin.query(`DROP DATABASE IF EXISTS ${DATABASE} WITH (FORCE)`);
    await admin.query(`CREATE DATABASE ${DATABASE}`);
  });
  return withDatabase(server, DATABASE);
}

async function dropDatabase(server) {
  await withClient(server, (admin) => admin.query(`DROP DATABASE IF EXISTS ${DATABASE} WITH (FORCE)`));
}

// N due no-op jobs through graphile_worker.add_jobs, FILL_CHUNK per call.
async function fill(client, n) {
  let left = n;
  while (left > 0) {
    const chunk = Math.min(left, FILL_CHUNK);
    const { rows } = await client.query(
      `SELECT count(*)::int AS added FROM ${SCHEMA}.add_jobs(ARRAY(
         SELECT ROW('noop', '{}'::json, NULL, NULL, NULL, NULL, NULL, NULL)::${SCHEMA}.job_spec
         FROM generate_series(1, $1::int)))`,
      [chunk],
    );
    if (rows[0].added !== chunk) throw new Error(`add_jobs added ${rows[0].added} of ${chunk}`);
    left -= chunk;
  }
}

async function countJobs(client) {
  const { rows } = await client.query(`SELECT count(*)::int AS n FROM ${SCHEMA}._private_jobs`);
  return rows[0].n;
}

const logger = new Logger((scope) => (level, message) => {
  if (level === "error" || level === "warning" || VERBOSE) {
    const label = scope?.label ? `${scope.label}: ` : "";
    process.stderr.write(`[graphile-worker ${level}] ${label}${message}\n`);
  }
});

async function burn(server, n, name, analyze) {
  const settings = CONFIGS[name];
  const url = await freshDatabase(server);
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    await runMigrations({ preset: { worker: { connectionString: url, schema: SCHEMA, logger } } });
    const fillStarted = performance.now();
    await fill(client, n);
    const filled = await countJobs(client);
    if (filled !== n) throw new Error(`filled ${filled} jobs, wanted ${n}`);
    if (analyze) await client.query(`ANALYZE ${SCHEMA}._private_jobs`);
    const fillMs = performance.now() - fillStarted;

    const events = new EventEmitter();
    let errors = 0;
    let failedForever = 0;
    let firstError = null;
    events.on("job:error", ({ error }) => {
      errors++;
      firstError ??= String(error?.message ?? error);
    });
    events.on("job:failed", () => {
      failedForever++;
    });
    let invoked = 0;
    let lastInvocation = null;
    // When each tenth of the jobs had run, to show a rate that changes as
    // the table drains.
    const tenth = Math.max(1, Math.floor(n / 10));
    const tenths = [];
    let allInvoked;
    const allInvokedPromise = new Promise((resolve) => {
      allInvoked = resolve;
    });
    const taskList = {
      noop() {
        invoked++;
        if (invoked % tenth === 0 && tenths.length < 10) tenths.push(performance.now());
        if (invoked === n) {
          lastInvocation = performance.now();
          allInvoked();
        }
      },
    };

    const deadline = Date.now() + TIMEOUT_S * 1000;
    const started = performance.now();
    const runner = await run({
      taskList,
      noHandleSignals: true,
      preset: {
        worker: { connectionString: url, schema: SCHEMA, logger, events, ...settings },
      },
    });
    const startupMs = performance.now() - started;
    let finished = null;
    try {
      // Until the task ran N times (or something failed), then until the
      // jobs table is empty: the last completions are committed.
      while (invoked < n && errors === 0) {
        if (Date.now() > deadline) break;
        await Promise.race([allInvokedPromise, sleep(50)]);
      }
      while (errors === 0 && Date.now() <= deadline) {
        const { rows } = await client.query(
          `SELECT EXISTS (SELECT 1 FROM ${SCHEMA}._private_jobs) AS left`,
        );
        if (!rows[0].left) {
          finished = performance.now();
          break;
        }
        await sleep(invoked < n ? 50 : 2);
      }
    } finally {
      await runner.stop();
    }
    const remaining = await countJobs(client);
    if (finished === null || errors > 0 || remaining !== 0 || invoked !== n) {
      throw new Error(
        `${name}: not a clean burn-down: task ran ${invoked} times for ${n} jobs, ` +
          `${remaining} jobs left in the table, ${errors} errors (${failedForever} failed for good)` +
          (firstError ? `, first: ${firstError}` : "") +
          (finished === null && errors === 0 ? `, timed out after ${TIMEOUT_S} s` : ""),
      );
    }
    const elapsedS = (finished - started) / 1000;
    const toLastInvocationS = (lastInvocation - started) / 1000;
    const jobsPerSByTenth = tenths.map((t, i) => round(tenth / ((t - (i ? tenths[i - 1] : started)) / 1000)));
    return {
      jobs: n,
      jobs_per_s: round(n / elapsedS),
      jobs_per_s_to_last_invocation: round(n / toLastInvocationS),
      jobs_per_s_by_tenth: jobsPerSByTenth,
      elapsed_s: round(elapsedS, 3),
      startup_ms: round(startupMs, 1),
      fill_s: round(fillMs / 1000, 2),
      analyze_after_fill: analyze,
      settings,
      checks: { task_invocations: invoked, jobs_left: remaining, job_errors: errors },
    };
  } finally {
    await client.end();
  }
}

function round(x, digits = 0) {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

async function main() {
  const { n, configs, analyze } = parseArgs(process.argv.slice(2));
  const server = serverUrl();
  const serverVersion = await withClient(server, async (c) => {
    const { rows } = await c.query("SELECT current_setting('server_version') AS v");
    return rows[0].v;
  });
  try {
    for (const name of configs) {
      const result = await burn(server, n, name, analyze);
      const line = {
        scenario: "pg_peer_graphile_worker",
        config: name,
        concurrent_jobs: result.settings.concurrentJobs,
        processes: 1,
        ...result,
        graphile_worker_version: GRAPHILE_VERSION,
        pg_client_version: PG_CLIENT_VERSION,
        node_version: process.versions.node,
        server_version: serverVersion,
      };
      process.stdout.write(`${JSON.stringify(line)}\n`);
    }
  } finally {
    await dropDatabase(server);
  }
}

main().catch((e) => {
  console.error(`burn.mjs: ${e?.stack ?? e}`);
  process.exit(1);
});
