"""What keeping idempotency keys costs: the enqueue statements of a baseline commit (keys
held by the job table only) against this tree's (keys claimed in job_key, migration 0017),
in turns on one database, and the archiver's move of keyed jobs with and without the trigger
that keeps their keys.

    .venv/bin/python bench/enqueue_keys.py [--dsn DSN] [--baseline 678632a] [--prefill 200000]
                                           [--enqueues 4000] [--rounds 5] [--dbname bench_keys]

A benchmark, not a test: it creates its own database (--dbname) on the server of --dsn,
migrates it with this tree's migrations, fills the job table with --prefill keyed done jobs
(so that the key indexes are not tiny), measures, prints medians and drops the database.

Each round runs every loop in turns of --slice enqueues, the order rotating, each loop's
clock running only in its own turns, on one connection in autocommit (statements prepared
by psycopg after their fifth run, as a client's pooled connection does):

    keyed       one job with a new key: `Client.enqueue(..., key=...)`;
    repeated    one job whose key a job in the table holds (the id comes back, nothing new);
    keyless     one job without a key;
    batch       enqueue_many of 100 jobs with new keys (per job).

`baseline` runs the statements of --baseline (read with `git show`), `new` this tree's, the
same Python around them (core/jobs.py's enqueue and enqueue_many); each enqueue commits, as
an application's does. Then the keyed statements alone, each run rolled back, which shows
the database's own share without the commit. Then the archive: batches
of 5,000 done keyed jobs moved to job_archive by maintenance_archive_done, the trigger enabled (new) or
disabled (baseline), in turns; and the same for keyless jobs, which the trigger's WHEN skips.
Last, --delete-on-complete's completion of 100 keyless jobs with and without the trigger.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from jobtui.core import jobs as core
from jobtui.kernel.db import Call, first_int, parse_statements, run, statements, without_comments
from jobtui.kernel.domain import Lease, NewJob
from jobtui.kernel.migrate import migrate

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
LOOPS = ("keyed", "repeated", "keyless", "batch")
BATCH = 100
ARCHIVE_BATCH = 5000
ENABLE = "ALTER TABLE jobtui.job ENABLE TRIGGER job_key_kept"
DISABLE = "ALTER TABLE jobtui.job DISABLE TRIGGER job_key_kept"


def baseline_statements(ref: str) -> dict[str, sql.SQL]:
    """The enqueue statements at `ref`, as this tree's Statements would send them."""
    shown = subprocess.run(
        ["git", "show", f"{ref}:jobtui/kernel/sql/jobs.sql"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    blocks = parse_statements({"jobs.sql": shown.stdout})
    out = {}
    for name in ("enqueue", "enqueue_existing", "enqueue_many", "enqueue_existing_many"):
        # Named `job_...` since the names begin with their file's noun.
        block = blocks[name] if name in blocks else blocks[f"job_{name}"]
        text = f"-- jobtui: {name}\n{without_comments(block)}"
        out[name] = sql.SQL(sql.SQL(text).format(schema=sql.Identifier("jobtui")).as_string(None))  # type: ignore[arg-type]
    return out


def with_dbname(dsn: str, name: str) -> str:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params: dict[str, Any] = {**conninfo_to_dict(dsn), "dbname": name}
    return make_conninfo("", **params)


class Loops:
    """The enqueues of one side (baseline or new) on one connection."""

    def __init__(self, conn: psycopg.Connection[Any], side: str, old: dict[str, sql.SQL], tag: str) -> None:
        self.conn, self.side, self.old, self.tag = conn, side, old, tag
        self.n = 0

    def _one(self, key: str | None) -> int:
        call = core.enqueue_call("bench.keys", {"n": self.n}, key=key)
        if self.side == "new":
            return core.enqueue(self.conn, call, "jobtui")
        # The baseline's enqueue(): its statement, then the existing job when the key is held.
        found = self.conn.execute(self.old["enqueue"], call.params).fetchone()
        if found is None:
            found = self.conn.execute(self.old["enqueue_existing"], {"key": key}).fetchone()
        assert found is not None
        return int(found[0])

    def keyed(self) -> int:
        self.n += 1
        self._one(f"{self.tag}-{self.side}-{self.n}")
        return 1

    def repeated(self) -> int:
        self._one("held-0")
        return 1

    def keyless(self) -> int:
        self.n += 1
        self._one(None)
        return 1

    def batch(self) -> int:
        jobs = []
        for _ in range(BATCH):
            self.n += 1
            jobs.append(NewJob("bench.keys", {"n": self.n}, key=f"{self.tag}-{self.side}-b{self.n}"))
        if self.side == "new":
            core.enqueue_many(self.conn, jobs, "jobtui")
        else:
            params = core.enqueue_many_params(jobs)
            self.conn.execute(self.old["enqueue_many"], params).fetchall()
        return BATCH


def one_round(dsn: str, old: dict[str, sql.SQL], enqueues: int, slice_n: int, turn: int) -> dict[str, float]:
    """Microseconds per job of each loop and side, in turns."""
    sides = [f"{loop}/{side}" for loop in LOOPS for side in ("baseline", "new")]
    spent = dict.fromkeys(sides, 0.0)
    done = dict.fromkeys(sides, 0)
    with psycopg.connect(dsn, autocommit=True) as conn:
        loops = {side: Loops(conn, side, old, f"r{turn}") for side in ("baseline", "new")}
        order = sides[turn % len(sides) :] + sides[: turn % len(sides)]
        while any(done[s] < enqueues for s in sides):
            for s in order:
                if done[s] >= enqueues:
                    continue
                loop, side = s.split("/")
                step: Callable[[], int] = getattr(loops[side], loop)
                target = min(enqueues, done[s] + slice_n)
                started = time.perf_counter()
                while done[s] < target:
                    done[s] += step()
                spent[s] += time.perf_counter() - started
            order = order[1:] + order[:1]
    return {s: spent[s] / done[s] * 1e6 for s in sides}


def statement_ab(dsn: str, old: dict[str, sql.SQL], runs: int) -> dict[str, float]:
    """The keyed statements alone, each run rolled back (nothing stays), baseline and new in
    turns on one connection: median microseconds of one job's and of a batch of 100's."""
    new = statements("jobtui")
    texts = {
        "keyed/baseline": old["enqueue"],
        "keyed/new": new["job_enqueue_keyed"],
        "batch/baseline": old["enqueue_many"],
        "batch/new": new["job_enqueue_many_keyed"],
    }
    times: dict[str, list[float]] = {name: [] for name in texts}
    with psycopg.connect(dsn) as conn:
        for i in range(runs):
            one = core.enqueue_call("bench.keys", {"n": i}, key=f"ab-{i}").params
            many = core.enqueue_many_params([NewJob("bench.keys", {"n": j}, key=f"ab-{i}-{j}") for j in range(BATCH)])
            names = list(texts) if i % 2 else list(reversed(texts))
            for name in names:
                params = one if name.startswith("keyed") else many
                started = time.perf_counter()
                conn.execute(texts[name], params).fetchall()
                times[name].append(time.perf_counter() - started)
                conn.rollback()
    skip = runs // 10  # the first runs plan and warm up
    return {name: statistics.median(t[skip:]) * 1e6 for name, t in times.items()}


def complete_deleting_ab(dsn: str, runs: int) -> dict[str, float]:
    """--delete-on-complete's statement on 100 keyless running jobs, the trigger enabled (new)
    and disabled (baseline), in turns, each run rolled back: median microseconds."""
    times: dict[str, list[float]] = {"baseline": [], "new": []}
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "INSERT INTO jobtui.job (type, payload, status, attempts, locked_by, locked_until, lease_token, started_at)"
            " SELECT 'bench.keys', '{}', 'running', 1, 'bench', now() + interval '1 hour', 7, now()"
            " FROM generate_series(1, %s) RETURNING id",
            (BATCH,),
        ).fetchall()
        conn.commit()
        call = core.complete_deleting_call([Lease(int(r[0]), 7) for r in rows])
        # In blocks of 50 runs: each switch of the trigger makes the statement planned again.
        for block in range(max(2, runs // 50)):
            side = "new" if block % 2 else "baseline"
            conn.execute(ENABLE if side == "new" else DISABLE)
            conn.commit()
            for _ in range(50):
                started = time.perf_counter()
                deleted = run(conn, call, "jobtui")
                times[side].append(time.perf_counter() - started)
                conn.rollback()
                assert len(deleted) == BATCH, deleted
        conn.execute(ENABLE)
        conn.execute("DELETE FROM jobtui.job WHERE id = ANY(%s)", ([r[0] for r in rows],))
        conn.commit()
    return {side: statistics.median(t) * 1e6 for side, t in times.items()}


def fill_done(conn: psycopg.Connection[Any], n: int, keyed: bool, tag: str) -> None:
    """`n` done jobs finished two days ago, keyed `TAG-1`... (with their keys claimed in job_key,
    as this release's enqueue claims them) or without keys."""
    conn.execute(
        "INSERT INTO jobtui.job (type, payload, idempotency_key, status, attempts, started_at, finished_at)"
        " SELECT 'bench.keys', '{}', CASE WHEN %(keyed)s THEN %(tag)s || '-' || g END, 'done', 1,"
        " now() - interval '3 days', now() - interval '2 days' FROM generate_series(1, %(n)s) AS g",
        {"keyed": keyed, "tag": tag, "n": n},
    )
    if keyed:
        conn.execute(
            "INSERT INTO jobtui.job_key (key, job_id) SELECT idempotency_key, id FROM jobtui.job"
            " WHERE idempotency_key LIKE %(pattern)s ON CONFLICT DO NOTHING",
            {"pattern": tag + "-%"},
        )


def archive_round(dsn: str, batches: int, turn: int) -> dict[str, float]:
    """Milliseconds per archive batch of 5,000: keyed jobs with the trigger (new) and without
    (baseline), and keyless jobs with and without it."""
    cases = ("keyed/baseline", "keyed/new", "keyless/baseline", "keyless/new")
    times: dict[str, list[float]] = {c: [] for c in cases}
    with psycopg.connect(dsn, autocommit=True) as conn:
        order = list(cases[turn % 4 :] + cases[: turn % 4])
        for i in range(batches):
            for case in order:
                kind, side = case.split("/")
                fill_done(conn, ARCHIVE_BATCH, kind == "keyed", f"a{turn}-{i}-{case}")
                conn.execute("VACUUM ANALYZE jobtui.job")
                conn.execute(ENABLE if side == "new" else DISABLE)
                started = time.perf_counter()
                with conn.transaction():
                    moved = run(
                        conn,
                        Call("maintenance_archive_done", {"retention": 86400.0, "limit": ARCHIVE_BATCH}, first_int),
                    )
                times[case].append(time.perf_counter() - started)
                assert moved == ARCHIVE_BATCH, moved
            order = order[1:] + order[:1]
        conn.execute(ENABLE)
    return {c: statistics.median(t) * 1000 for c, t in times.items()}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", default=os.environ.get("JOBTUI_BENCH_DSN", DEFAULT_DSN))
    p.add_argument("--baseline", default="678632a", help="the commit whose enqueue statements are the baseline")
    p.add_argument("--prefill", type=int, default=200_000, help="keyed done jobs in the table before the loops")
    p.add_argument("--enqueues", type=int, default=4000, help="jobs per loop and side in a round")
    p.add_argument("--slice", type=int, default=200, help="jobs per turn")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--archive-batches", type=int, default=3, help="archive batches per case in a round")
    p.add_argument("--statement-runs", type=int, default=2000, help="runs of the statement A/B (default 2000)")
    p.add_argument("--dbname", default="bench_keys")
    args = p.parse_args(argv)
    old = baseline_statements(args.baseline)
    admin_dsn = with_dbname(args.dsn, "postgres")
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(args.dbname)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(args.dbname)))
    dsn = with_dbname(args.dsn, args.dbname)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate(conn)
            fill_done(conn, args.prefill, True, "prefill")
            conn.execute(
                "INSERT INTO jobtui.job (type, payload, idempotency_key) VALUES ('bench.keys', '{}', 'held-0')"
            )
            conn.execute("INSERT INTO jobtui.job_key (key, job_id) SELECT 'held-0', id FROM jobtui.job"
                         " WHERE idempotency_key = 'held-0'")  # fmt: skip
            conn.execute("VACUUM ANALYZE")
        statements()  # compiled before the clock
        load = os.getloadavg()[0]
        print(f"enqueue, microseconds per job, medians of {args.rounds} rounds; baseline = {args.baseline}'s"
              f" statements; {args.prefill:,} keyed jobs in the table; 1-min load {load:.2f}")  # fmt: skip
        rounds = [one_round(dsn, old, args.enqueues, args.slice, t) for t in range(args.rounds)]
        print("| enqueue | baseline µs | new µs | new vs baseline |\n| --- | ---: | ---: | ---: |")
        for loop in LOOPS:
            before = statistics.median(r[f"{loop}/baseline"] for r in rounds)
            after = statistics.median(r[f"{loop}/new"] for r in rounds)
            ratio = statistics.median(r[f"{loop}/new"] / r[f"{loop}/baseline"] for r in rounds)
            print(f"| {loop} | {before:.1f} | {after:.1f} | {ratio - 1:+.1%} |", flush=True)
        ab = statement_ab(dsn, old, args.statement_runs)
        print(f"\nthe keyed statements alone, rolled back, {args.statement_runs} runs each in turns, median µs")
        print("| statement | baseline | new | new vs baseline |\n| --- | ---: | ---: | ---: |")
        for what in ("keyed", "batch"):
            before, after = ab[f"{what}/baseline"], ab[f"{what}/new"]
            label = "one job" if what == "keyed" else f"{BATCH} jobs"
            print(f"| {label} | {before:.0f} | {after:.0f} | {after / before - 1:+.1%} |", flush=True)
        archived = [archive_round(dsn, args.archive_batches, t) for t in range(args.rounds)]
        print(f"\narchive_done, ms per batch of {ARCHIVE_BATCH:,}, medians of {args.rounds} rounds")
        print("| jobs | without the trigger | with it | with vs without |\n| --- | ---: | ---: | ---: |")
        for kind in ("keyed", "keyless"):
            before = statistics.median(r[f"{kind}/baseline"] for r in archived)
            after = statistics.median(r[f"{kind}/new"] for r in archived)
            ratio = statistics.median(r[f"{kind}/new"] / r[f"{kind}/baseline"] for r in archived)
            print(f"| {kind} | {before:.0f} | {after:.0f} | {ratio - 1:+.1%} |", flush=True)
        deleting = complete_deleting_ab(dsn, args.statement_runs)
        print(f"\ncomplete_deleting (--delete-on-complete) of {BATCH} keyless jobs, rolled back,"
              f" {args.statement_runs} runs each in turns, median µs")  # fmt: skip
        print("| without the trigger | with it | with vs without |\n| ---: | ---: | ---: |")
        before, after = deleting["baseline"], deleting["new"]
        print(f"| {before:.0f} | {after:.0f} | {after / before - 1:+.1%} |", flush=True)
        print(f"1-min load at the end {os.getloadavg()[0]:.2f}")
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(args.dbname)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
