"""What rates cost the claim: the claim statement of a baseline commit against this tree's,
in turns on one table in one process.

    .venv/bin/python bench/claim_rates.py [--dsn DSN] [--baseline c7e9f9b] [--jobs 60000]
                                          [--batches 10,200] [--rounds 3] [--dbname bench_i28]

A benchmark, not a test: it creates its own database (--dbname) on the server of --dsn,
migrates it with this tree's migrations, measures, prints the medians and drops it again.
Each round fills the table with --jobs jobs of one type in the default queue, then loops
claim a batch and complete it, taking turns of --slice jobs (their order rotating), each
loop's clock running only in its own turns:

    baseline   the claim statement of --baseline (read with `git show`), which knows no rates;
    new        this tree's claim, no rate set anywhere: one small subquery finds none;
    new+other  this tree's claim, a rate set on another queue, which has no job: claim_rated
               is called, locks that queue's bucket and looks among the first due jobs;
    rated      this tree's claim, the drained type rated far above what the loop reaches
               (1,000,000/s): every claim takes tokens of its bucket.

Before each turn the control rows are set for the loop that runs next. Ratios are against
baseline, as the median of the per-round ratios. Then the claim statement alone, without a
rate: baseline and new in turns, each run rolled back, which resolves smaller differences.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from jobtui import NewJob, Queue
from jobtui.core import queues
from jobtui.core.queue import claim_call, complete_call
from jobtui.kernel.db import Call, run, statements
from jobtui.kernel.domain import Lease
from jobtui.kernel.migrate import migrate

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
JOB_TYPE = "bench.rates"
LOOPS = ("baseline", "new", "new+other", "rated")


def baseline_claim(ref: str) -> str:
    """The `claim` block of the statements at `ref` (sql/claims.sql, or the one queries.sql of
    releases before the layer folders), with the schema filled in."""
    text = ""
    for path in ("jobtui/kernel/sql/claims.sql", "jobtui/sql/queries.sql"):
        shown = subprocess.run(["git", "show", f"{ref}:{path}"], cwd=ROOT, capture_output=True, text=True)
        if shown.returncode == 0:
            text = shown.stdout
            break
    body = text.split("-- name: claim\n", 1)[1].split("\n-- name: ", 1)[0]
    return body.replace("{schema}", '"jobtui"')


def with_dbname(dsn: str, name: str) -> str:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params: dict[str, Any] = {**conninfo_to_dict(dsn), "dbname": name}
    return make_conninfo("", **params)


def set_controls(conn: psycopg.Connection[Any], loop: str) -> None:
    conn.execute("DELETE FROM jobtui.queue_control")
    if loop == "new+other":
        queues.set_rate(conn, "queue", "elsewhere", 5.0, actor="bench")
    elif loop == "rated":
        queues.set_rate(conn, "type", JOB_TYPE, 1_000_000.0, actor="bench")


def cycle(conn: psycopg.Connection[Any], loop: str, batch: int, old: str) -> int:
    if loop == "baseline":
        params = claim_call([JOB_TYPE], worker="bench", limit=batch, lease=30.0).params
        with conn.cursor(binary=True) as cur:
            cur.execute(sql.SQL(old), params)
            rows = cur.fetchall()
        leases = [Lease(int(r[0]), int(r[5])) for r in rows]
    else:
        leases = [j.lease for j in run(conn, claim_call([JOB_TYPE], worker="bench", limit=batch, lease=30.0))]
    if not leases:
        return 0
    return len(run(conn, complete_call(leases)))


def one_round(dsn: str, jobs: int, batch: int, slice_jobs: int, old: str, turn: int) -> dict[str, float]:
    with Queue(dsn) as q:
        for start in range(0, jobs, 10_000):
            q.enqueue_many([NewJob(JOB_TYPE, {}) for _ in range(min(10_000, jobs - start))])
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("VACUUM ANALYZE jobtui.job")
    quota = jobs // len(LOOPS)
    done = dict.fromkeys(LOOPS, 0)
    spent = dict.fromkeys(LOOPS, 0.0)
    order = list(LOOPS[turn % len(LOOPS) :] + LOOPS[: turn % len(LOOPS)])
    with psycopg.connect(dsn, autocommit=True) as conn, psycopg.connect(dsn, autocommit=True) as control:
        conn.execute("SET TimeZone = 'UTC'")
        while any(done[loop] < quota for loop in LOOPS):
            for loop in order:
                if done[loop] >= quota:
                    continue
                set_controls(control, loop)
                started = time.perf_counter()
                target = min(quota, done[loop] + slice_jobs)
                while done[loop] < target:
                    n = cycle(conn, loop, min(batch, target - done[loop]), old)
                    if n == 0:
                        break
                    done[loop] += n
                spent[loop] += time.perf_counter() - started
            order = order[1:] + order[:1]
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("DELETE FROM jobtui.job")
        admin.execute("DELETE FROM jobtui.queue_control")
        admin.execute("VACUUM jobtui.job")
    return {loop: done[loop] / spent[loop] for loop in LOOPS}


def statement_ab(dsn: str, old: str, batch: int, jobs: int, runs: int) -> tuple[float, float]:
    """The claim statement alone, each run rolled back (nothing changes), old and new in
    turns on one connection (both prepared by psycopg after their fifth run): median ms."""
    with Queue(dsn) as q:
        q.enqueue_many([NewJob(JOB_TYPE, {}) for _ in range(jobs)])
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("VACUUM ANALYZE jobtui.job")
    params = claim_call([JOB_TYPE], worker="bench", limit=batch, lease=30.0).params
    times: dict[str, list[float]] = {"old": [], "new": []}
    texts = {"old": sql.SQL(old), "new": statements()["claim"]}
    with psycopg.connect(dsn) as conn:
        for i in range(runs):
            for name in ("old", "new") if i % 2 else ("new", "old"):
                started = time.perf_counter()
                conn.execute(texts[name], params).fetchall()
                times[name].append(time.perf_counter() - started)
                conn.rollback()
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("DELETE FROM jobtui.job")
    skip = runs // 10  # the first runs plan and warm up
    return statistics.median(times["old"][skip:]) * 1000, statistics.median(times["new"][skip:]) * 1000


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", default=os.environ.get("JOBTUI_BENCH_DSN", DEFAULT_DSN))
    p.add_argument("--baseline", default="c7e9f9b", help="the commit whose claim statement is the baseline")
    p.add_argument("--jobs", type=int, default=60_000, help="jobs per round, shared by the loops")
    p.add_argument("--slice", type=int, default=2_000, help="jobs per turn")
    p.add_argument("--batches", default="10,200")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dbname", default="bench_i28")
    p.add_argument("--statement-runs", type=int, default=2000, help="runs of the statement A/B (default 2000)")
    args = p.parse_args(argv)
    old = baseline_claim(args.baseline)
    admin_dsn = with_dbname(args.dsn, "postgres")
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(args.dbname)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(args.dbname)))
    dsn = with_dbname(args.dsn, args.dbname)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate(conn)
            run(conn, Call("db_now", {}, lambda r: None), "jobtui")
        statements()  # compiled before the clock
        print(f"claim + complete, jobs/s; baseline = the claim of {args.baseline}; medians of {args.rounds} rounds")
        print("| batch | " + " | ".join(LOOPS) + " | " + " | ".join(f"{loop} vs baseline" for loop in LOOPS[1:]) + " |")
        print("| ---: " * (2 * len(LOOPS)) + "|")
        for batch in (int(b) for b in args.batches.split(",")):
            rounds = [one_round(dsn, args.jobs, batch, args.slice, old, t) for t in range(args.rounds)]
            rates = {loop: statistics.median(r[loop] for r in rounds) for loop in LOOPS}
            ratios = [statistics.median(r[loop] / r["baseline"] for r in rounds) for loop in LOOPS[1:]]
            cells = [f"{rates[loop]:,.0f}" for loop in LOOPS] + [f"{x - 1:+.1%}" for x in ratios]
            print(f"| {batch} | " + " | ".join(cells) + " |", flush=True)
        print(f"\nthe claim statement alone, rolled back, {args.statement_runs} runs each in turns, median ms")
        print("| batch | baseline | new | new vs baseline |\n| ---: | ---: | ---: | ---: |")
        for batch in (int(b) for b in args.batches.split(",")):
            before, after = statement_ab(dsn, old, batch, 20_000, args.statement_runs)
            print(f"| {batch} | {before:.3f} | {after:.3f} | {after / before - 1:+.1%} |", flush=True)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(args.dbname)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
