"""What levers cost the claim: this tree's claim against a baseline commit's and against the
minimal claim, under each lever state, in turns on one table in one process.

    .venv/bin/python bench/claim_rates.py [--dsn DSN] [--baseline main] [--jobs 70000]
                                          [--batches 10,200] [--rounds 5] [--dbname bench_i28]

A benchmark, not a test: it creates its own database (--dbname) on the server of --dsn,
migrates it with this tree's migrations, measures, prints the medians and drops it again.
Each round fills the table with --jobs jobs of one type in the default queue, then loops
claim a batch and complete it, taking turns of --slice jobs (their order rotating), each
loop's clock running only in its own turns. Every loop sends its claim's text with psycopg
on the same connection and completes with jobtui's complete, so only the claim differs:

    minimal     bench/core.py's minimal raw claim: the walk of the ready index, no lever work;
    X           the claim of X, no lever set anywhere;
    X+other     the claim of X, for every queue, a rate set on another queue, which has no
                job (a claim of every queue may take that queue's jobs, so its rate is in reach);
    X+rated     the claim of X, the drained type rated far above what the loop reaches
                (1,000,000/s): every claim takes tokens of its bucket;
    own+other   this tree's claim of the default queue, a rate on another queue: out of reach;

where X is `base` (the claim of --baseline, read with `git show`) or `new` (this tree's).
Before each turn the control rows are set for the loop that runs next. For each loop: its
drain rate, and the server's CPU per job (the claiming backend's time on a CPU during the
loop's turns, from /proc/PID/schedstat: the server must be on this machine), which the load
of other work on the machine moves far less than the rate. Ratios are the median of the
per-round ratios. Then the claim statement alone, without a lever: minimal,
base and new in turns, each run rolled back, which resolves smaller differences; and the
statement alone under each lever state, every lever set at once on a table of two types
(`new` claims the default queue, out of every lever's reach; `new+other` every queue, a
rated queue in reach; `new+rated` the rated type), with the server's CPU of each run.
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

from jobtui import Client, NewJob
from jobtui.core import queues
from jobtui.core.claims import claim_call, complete_call
from jobtui.kernel.db import Call, parse_blocks, run, statements, with_fragments
from jobtui.kernel.domain import DEFAULT_MAX_ATTEMPTS, Lease
from jobtui.kernel.migrate import migrate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from core import RAW_CLAIM_MINIMAL

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
JOB_TYPE = "bench.rates"
LOOPS = ("minimal", "base", "base+other", "base+rated", "new", "new+other", "own+other", "new+rated")
# (loop, against): the ratios printed, each the median of the per-round ratios.
RATIOS = (
    ("base", "minimal"),
    ("new", "minimal"),
    ("new+other", "new"),
    ("own+other", "new"),
    ("new+rated", "new"),
    ("base+other", "base"),
    ("base+rated", "base"),
    ("new+other", "minimal"),
)


def baseline_claim(ref: str) -> str:
    """The claim's block of the statements at `ref` (sql/claims.sql, or the one queries.sql of
    releases before the layer folders; named `claim_take`, or `claim` before the names began
    with their file's noun), with the fragments it names written out and the schema filled in."""
    text = ""
    for path in ("jobtui/kernel/sql/claims.sql", "jobtui/sql/queries.sql"):
        shown = subprocess.run(["git", "show", f"{ref}:{path}"], cwd=ROOT, capture_output=True, text=True)
        if shown.returncode == 0:
            text = shown.stdout
            break
    if not text:
        raise SystemExit(f"no claim statement at {ref!r}")
    texts, fragments = parse_blocks({path: text})
    body = texts["claim_take"] if "claim_take" in texts else texts["claim"]
    return with_fragments(body, fragments).replace("{schema}", '"jobtui"')


def with_dbname(dsn: str, name: str) -> str:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params: dict[str, Any] = {**conninfo_to_dict(dsn), "dbname": name}
    return make_conninfo("", **params)


def set_controls(conn: psycopg.Connection[Any], loop: str) -> None:
    conn.execute("DELETE FROM jobtui.queue_control")
    if loop.endswith("+other"):
        queues.set_rate(conn, "queue", "elsewhere", 5.0, actor="bench")
    elif loop.endswith("+rated"):
        queues.set_rate(conn, "type", JOB_TYPE, 1_000_000.0, actor="bench")


class Claims:
    """The claim text and parameters of each loop, sent the same way."""

    def __init__(self, base: str) -> None:
        new = statements()["claim_take"].as_string(None)
        self.texts = {"minimal": sql.SQL(RAW_CLAIM_MINIMAL), "base": sql.SQL(base), "new": sql.SQL(new)}

    def call(self, loop: str, batch: int) -> tuple[sql.SQL, Any]:
        if loop == "minimal":
            types = [JOB_TYPE]
            return self.texts["minimal"], ([None], types, DEFAULT_MAX_ATTEMPTS, "bench", 30.0, types, batch)
        queue = "default" if loop.startswith("own") else None
        params = claim_call([JOB_TYPE], worker="bench", limit=batch, lease=30.0, queue=queue).params
        return self.texts["new" if loop.startswith("own") else loop.split("+")[0]], params


def cycle(conn: psycopg.Connection[Any], claims: Claims, loop: str, batch: int) -> int:
    text, params = claims.call(loop, batch)
    with conn.cursor(binary=True) as cur:
        cur.execute(text, params)
        rows = cur.fetchall()
    if not rows:
        return 0
    return len(run(conn, complete_call([Lease(int(r[0]), int(r[5])) for r in rows])))


def claim_session(conn: psycopg.Connection[Any], generic: bool) -> None:
    """The worker's claiming connection: its settings (sql/claims.sql, claim_session), and
    with `generic` one plan kept for each statement rather than one planned per call."""
    conn.execute(statements()["claim_session"])
    if generic:
        conn.execute("SET plan_cache_mode = force_generic_plan")


def backend_cpu(pid: int) -> float:
    """Seconds on a CPU of the server process `pid` (nanoseconds in /proc/PID/schedstat): the
    server's cost, which the load of the other work on the machine changes far less than the
    time a loop takes."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9


def one_round(
    dsn: str, jobs: int, batch: int, slice_jobs: int, claims: Claims, turn: int, loops: Sequence[str], generic: bool
) -> dict[str, tuple[float, float]]:
    """(jobs/s, server CPU µs per job) of each loop."""
    with Client(dsn) as q:
        for start in range(0, jobs, 10_000):
            q.enqueue_many([NewJob(JOB_TYPE, {}) for _ in range(min(10_000, jobs - start))])
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("VACUUM ANALYZE jobtui.job")
    quota = jobs // len(loops)
    done = dict.fromkeys(loops, 0)
    spent = dict.fromkeys(loops, 0.0)
    server = dict.fromkeys(loops, 0.0)
    order = list(loops[turn % len(loops) :]) + list(loops[: turn % len(loops)])
    with psycopg.connect(dsn, autocommit=True) as conn, psycopg.connect(dsn, autocommit=True) as control:
        claim_session(conn, generic)
        pid = conn.info.backend_pid
        while any(done[loop] < quota for loop in loops):
            for loop in order:
                if done[loop] >= quota:
                    continue
                set_controls(control, loop)
                started, cpu = time.perf_counter(), backend_cpu(pid)
                target = min(quota, done[loop] + slice_jobs)
                while done[loop] < target:
                    n = cycle(conn, claims, loop, min(batch, target - done[loop]))
                    if n == 0:
                        break
                    done[loop] += n
                spent[loop] += time.perf_counter() - started
                server[loop] += backend_cpu(pid) - cpu
            order = order[1:] + order[:1]
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("DELETE FROM jobtui.job")
        admin.execute("DELETE FROM jobtui.queue_control")
        admin.execute("VACUUM jobtui.job")
    return {loop: (done[loop] / spent[loop], server[loop] / done[loop] * 1e6) for loop in loops}


def statement_ab(dsn: str, claims: Claims, batch: int, jobs: int, runs: int) -> dict[str, float]:
    """The claim statement alone, no lever set, each run rolled back (nothing changes),
    minimal, base and new in turns on one connection (each prepared by psycopg after its
    fifth run): median ms."""
    with Client(dsn) as q:
        q.enqueue_many([NewJob(JOB_TYPE, {}) for _ in range(jobs)])
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("DELETE FROM jobtui.queue_control")
        admin.execute("VACUUM ANALYZE jobtui.job")
    names = ["minimal", "base", "new"]
    times: dict[str, list[float]] = {name: [] for name in names}
    with psycopg.connect(dsn) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        conn.commit()
        for i in range(runs):
            for name in names[i % 3 :] + names[: i % 3]:
                text, params = claims.call(name, batch)
                started = time.perf_counter()
                with conn.cursor(binary=True) as cur:
                    cur.execute(text, params)
                    cur.fetchall()
                times[name].append(time.perf_counter() - started)
                conn.rollback()
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("DELETE FROM jobtui.job")
    skip = runs // 10  # the first runs plan and warm up
    return {name: statistics.median(times[name][skip:]) * 1000 for name in names}


RATED_TYPE = "bench.rated"
# The statement under each lever state, all set at once on one table (levers_ab): the claim
# of `new` takes the default queue, which no lever reaches; `new+other` every queue, with
# the rated queue `elsewhere` (no job) in reach; `new+rated` the rated type's jobs.
LEVER_STATES = ("minimal", "new", "new+other", "new+rated")


def levers_ab(dsn: str, claims: Claims, batch: int, jobs: int, runs: int) -> dict[str, tuple[float, float]]:
    """The claim statement alone under each lever state, every lever set once and left so:
    a table of two types interleaved, a rate on another queue and one on the second type; each
    run rolled back (nothing changes but the bucket's dead row versions), the states in turns
    on one connection with the claim session. (median ms, median server µs) per run."""
    with Client(dsn) as q:
        q.enqueue_many([NewJob(JOB_TYPE if i % 2 else RATED_TYPE, {}) for i in range(jobs)])
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("DELETE FROM jobtui.queue_control")
        queues.set_rate(admin, "queue", "elsewhere", 5.0, actor="bench")
        queues.set_rate(admin, "type", RATED_TYPE, 1_000_000.0, actor="bench")
        admin.execute("VACUUM ANALYZE jobtui.job")
    calls = {
        "minimal": claims.call("minimal", batch),
        "new": (
            claims.texts["new"],
            claim_call([JOB_TYPE], worker="bench", limit=batch, lease=30.0, queue="default").params,
        ),
        "new+other": (claims.texts["new"], claim_call([JOB_TYPE], worker="bench", limit=batch, lease=30.0).params),
        "new+rated": (
            claims.texts["new"],
            claim_call([RATED_TYPE], worker="bench", limit=batch, lease=30.0, queue="default").params,
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in LEVER_STATES}
    server: dict[str, list[float]] = {name: [] for name in LEVER_STATES}
    names = list(LEVER_STATES)
    with psycopg.connect(dsn) as conn:
        claim_session(conn, False)
        conn.commit()
        pid = conn.info.backend_pid
        for i in range(runs):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                text, params = calls[name]
                started, cpu = time.perf_counter(), backend_cpu(pid)
                with conn.cursor(binary=True) as cur:
                    cur.execute(text, params)
                    assert len(cur.fetchall()) == batch, name
                conn.rollback()
                times[name].append(time.perf_counter() - started)
                server[name].append(backend_cpu(pid) - cpu)
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("DELETE FROM jobtui.job")
        admin.execute("DELETE FROM jobtui.queue_control")
    skip = runs // 10
    return {
        name: (statistics.median(times[name][skip:]) * 1000, statistics.median(server[name][skip:]) * 1e6)
        for name in names
    }


def planning_ab(dsn: str, claims: Claims, batch: int, runs: int) -> dict[str, float]:
    """What planning each claim costs: `EXPLAIN` of minimal, base and new in turns, on the
    claim session, never prepared (PostgreSQL plans the claim at every call anyway: it never
    picks a generic plan for it): median ms, a round trip included."""
    names = ["minimal", "base", "new"]
    times: dict[str, list[float]] = {name: [] for name in names}
    with psycopg.connect(dsn, autocommit=True) as conn:
        claim_session(conn, False)
        for i in range(runs):
            for name in names[i % 3 :] + names[: i % 3]:
                text, params = claims.call(name, batch)
                started = time.perf_counter()
                conn.execute(sql.SQL("EXPLAIN ") + text, params, prepare=False).fetchall()
                times[name].append(time.perf_counter() - started)
    skip = runs // 10
    return {name: statistics.median(times[name][skip:]) * 1000 for name in names}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", default=os.environ.get("JOBTUI_BENCH_DSN", DEFAULT_DSN))
    p.add_argument("--baseline", default="main", help="the commit whose claim statement is `base`")
    p.add_argument("--jobs", type=int, default=8 * 10_000, help="jobs per round, shared by the loops")
    p.add_argument("--slice", type=int, default=2_000, help="jobs per turn")
    p.add_argument("--batches", default="10,200")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--dbname", default="bench_i28")
    p.add_argument("--statement-runs", type=int, default=2000, help="runs of the statement A/B (default 2000)")
    p.add_argument("--loops", default=",".join(LOOPS), help="comma-separated, of: " + ", ".join(LOOPS))
    p.add_argument(
        "--plan",
        choices=("custom", "generic"),
        default="custom",
        help="generic: plan_cache_mode force_generic_plan on the claiming connection",
    )
    args = p.parse_args(argv)
    claims = Claims(baseline_claim(args.baseline))
    loops = [loop for loop in args.loops.split(",") if loop]
    if unknown := set(loops) - set(LOOPS):
        p.error(f"unknown loops {sorted(unknown)}")
    generic = args.plan == "generic"
    admin_dsn = with_dbname(args.dsn, "postgres")
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(args.dbname)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(args.dbname)))
    dsn = with_dbname(args.dsn, args.dbname)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate(conn)
            run(conn, Call("server_now", {}, lambda r: None), "jobtui")
        print(f"claim + complete, jobs/s; base = the claim of {args.baseline}; medians of {args.rounds} rounds")
        print(f"plans: {args.plan}")
        print("| batch | | " + " | ".join(loops) + " |\n| ---: | --- " + "| ---: " * len(loops) + "|")
        ratios: dict[int, list[float]] = {}
        cpu_ratios: dict[int, list[float]] = {}
        for batch in (int(b) for b in args.batches.split(",")):
            rounds = [
                one_round(dsn, args.jobs, batch, args.slice, claims, t, loops, generic) for t in range(args.rounds)
            ]
            rates = {loop: statistics.median(r[loop][0] for r in rounds) for loop in loops}
            cpu = {loop: statistics.median(r[loop][1] for r in rounds) for loop in loops}
            ratios[batch] = [
                statistics.median(r[a][0] / r[b][0] for r in rounds) if a in loops and b in loops else float("nan")
                for a, b in RATIOS
            ]
            cpu_ratios[batch] = [
                statistics.median(r[a][1] / r[b][1] for r in rounds) if a in loops and b in loops else float("nan")
                for a, b in RATIOS
            ]
            print(f"| {batch} | jobs/s | " + " | ".join(f"{rates[loop]:,.0f}" for loop in loops) + " |")
            print(f"| {batch} | server µs/job | " + " | ".join(f"{cpu[loop]:.1f}" for loop in loops) + " |", flush=True)
        print("\ncost: drain rate below the reference (1 - loop / reference) and server CPU per job above it")
        print("(loop / reference - 1), medians of the rounds' ratios")
        print("| loop | against | " + " | ".join(f"batch {b}: drain | server CPU" for b in ratios) + " |")
        print("| --- | --- " + "| ---: | ---: " * len(ratios) + "|")
        for i, (a, b) in enumerate(RATIOS):
            cells = [f"{1 - ratios[n][i]:+.1%} | {cpu_ratios[n][i] - 1:+.1%}" for n in ratios]
            if all(c == "+nan% | +nan%" for c in cells):
                continue
            print(f"| {a} | {b} | " + " | ".join(cells) + " |")
        runs = args.statement_runs
        print(f"\nthe claim statement alone, no lever, rolled back, {runs} runs each in turns, median ms")
        print("| batch | minimal | base | new | base vs minimal | new vs minimal |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: |")
        for batch in (int(b) for b in args.batches.split(",")):
            ms = statement_ab(dsn, claims, batch, 20_000, args.statement_runs)
            print(
                f"| {batch} | {ms['minimal']:.3f} | {ms['base']:.3f} | {ms['new']:.3f} "
                f"| {ms['base'] / ms['minimal'] - 1:+.1%} | {ms['new'] / ms['minimal'] - 1:+.1%} |",
                flush=True,
            )
        print(f"\nthe claim statement alone under each lever state, all set at once, rolled back, {runs} runs each")
        print("in turns: median ms and median server µs per run, and the server's against `new`")
        print(
            "| batch | "
            + " | ".join(LEVER_STATES)
            + " | "
            + " | ".join(f"{s} vs new" for s in LEVER_STATES if s != "new")
            + " |"
        )
        print("| ---: " + "| ---: " * (2 * len(LEVER_STATES) - 1) + "|")
        for batch in (int(b) for b in args.batches.split(",")):
            got = levers_ab(dsn, claims, batch, 20_000, args.statement_runs)
            cells = [f"{got[s][0]:.3f} ms, {got[s][1]:.0f} µs" for s in LEVER_STATES]
            cells += [f"{got[s][1] / got['new'][1] - 1:+.1%}" for s in LEVER_STATES if s != "new"]
            print(f"| {batch} | " + " | ".join(cells) + " |", flush=True)
        ms = planning_ab(dsn, claims, 10, max(100, runs // 2))
        print(f"\nplanning alone (EXPLAIN, a round trip each), {max(100, runs // 2)} runs each in turns, median ms")
        print("| minimal | base | new | base vs minimal | new vs minimal |\n| ---: | ---: | ---: | ---: | ---: |")
        print(
            f"| {ms['minimal']:.3f} | {ms['base']:.3f} | {ms['new']:.3f} "
            f"| {ms['base'] / ms['minimal'] - 1:+.1%} | {ms['new'] / ms['minimal'] - 1:+.1%} |"
        )
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(args.dbname)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
