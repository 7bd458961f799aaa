"""Ways to drain for less: claim and complete loops that differ in one thing, side by side.

    .venv/bin/python bench/drain_candidates.py [--dsn DSN] [--jobs 40000] [--batch 200]
                                               [--rounds 3] [--slice 2000] [--keep-done]
                                               [--loops two,pipeline,...] [--hot-fillfactor 80]

A benchmark, not a test. In its own database (jobtui_bench_candidates, dropped at the end)
it drains no-op jobs with one connection per loop, each loop running jobtui's own
`claim_take` and `claim_complete_deleting` (or `claim_complete`, with --keep-done) of
sql/claims.sql, and differing from
`two` in one thing only:

    two        claim, then complete the batch: two statements, two round trips, two commits
               (what the raw loop of bench/core.py does, and a worker's connections do apart)
    pipeline   the completion of the previous batch and the next claim sent together in
               psycopg's pipeline mode, inside `conn.transaction()` (BEGIN and COMMIT sent
               as statements of their own): one round trip, one commit
    pipeline-autocommit
               the same without BEGIN and COMMIT: nothing syncs between the two statements,
               so they still run in one (implicit) transaction: one round trip, one commit
    combined   one statement: the completion of the previous batch as a CTE of the claim
    hot        `two` on a copy of the schema whose indexes name no column the claim sets (the
               ready index is partial on `finished_at IS NULL`, not on the status; no running,
               dead or finished index) and whose fillfactor leaves room on each page: the
               claim's update can be HOT. This is the upper bound of what a HOT claim saves:
               without an index of running jobs, the reaper would have to read the backlog
    raw-claim  `two` with the raw loop's claim (bench/core.py), which reads no pauses or
               limits: what the claim's reads of queue_control cost
    fence-array
               `two` with the completion's fence as it was until December 2026: each row's
               token found by array_position in an array of ids (a scan of the ids per row),
               not looked up in the jsonb object of id -> token (a binary search per row)
    fence-dense
               `two` with the tokens sent as an array whose subscripts are the job ids
               (`'[lo:hi]={...}'`, 0 in the gaps): one subscript per row

Each loop's connection is set up as a worker's claiming connection (`claim_session`: the
planner settings and jit off; with the planner settings alone, the claim is priced high
enough for jit to compile it at every execution).

Every loop drains --jobs jobs of its own table per round, taking turns of --slice jobs with
the others (the order rotating), each loop's clocks running only in its own turns. Each loop
reads its own backend's CPU time from /proc (so the server must be local), and this
process's CPU time, over its turns: server and client microseconds per job, immune to other
tenants of the machine. Medians over the rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from jobtui import Client, NewJob
from jobtui.kernel.db import statements
from jobtui.kernel.domain import DEFAULT_MAX_ATTEMPTS
from jobtui.kernel.migrate import migrate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from core import RAW_CLAIM_MINIMAL  # bench/ is not a package

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
BENCH_DB = "jobtui_bench_candidates"
JOB_TYPE = "bench.candidates"
TICKS = os.sysconf("SC_CLK_TCK")
LOOPS = ("two", "pipeline", "pipeline-autocommit", "combined", "hot", "raw-claim", "fence-array", "fence-dense")
FENCE = "j.lease_token = (%(leases)s::jsonb ->> j.id::text)::bigint"
FENCES = {
    "fence-array": "j.lease_token = (%(tokens)s::bigint[])[array_position(%(ids)s::bigint[], j.id)]",
    "fence-dense": "j.lease_token = (%(dense)s::bigint[])[j.id]",
}

# The HOT variant's indexes: none holds a column the claim writes (status, attempts,
# lease_token, locked_*, heartbeat_at, started_at, max_attempts), in its keys, INCLUDE or
# predicate.
HOT_INDEXES = """
DROP INDEX {schema}.job_ready_idx, {schema}.job_running_idx, {schema}.job_dead_idx, {schema}.job_finished_idx;
CREATE INDEX job_pending_idx ON {schema}.job (run_at, id) INCLUDE (type) WHERE finished_at IS NULL;
CREATE INDEX job_finished_idx ON {schema}.job (finished_at) INCLUDE (type) WHERE finished_at IS NOT NULL;
ALTER TABLE {schema}.job SET (fillfactor = {fillfactor});
"""


def backend_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def with_dbname(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo(**params)  # type: ignore[arg-type,unused-ignore]


def claim_params(batch: int, worker: str) -> dict[str, Any]:
    return {
        "types": [JOB_TYPE],
        "max_attempts": [None],
        "default_max_attempts": DEFAULT_MAX_ATTEMPTS,
        "worker": worker,
        "limit": batch,
        "lease": 30.0,
        "queue": None,
    }


def lease_params(rows: Sequence[Any], prefix: str = "") -> dict[str, Any]:
    """The leases of claimed rows as jobtui's calls send them (a bigint[] literal and a JSON
    object of id -> token), and the tokens as a bigint[] literal (for `fence-array`)."""
    return {
        f"{prefix}ids": "{" + ",".join(str(r[0]) for r in rows) + "}",
        f"{prefix}leases": "{" + ",".join(f'"{r[0]}":{r[5]}' for r in rows) + "}",
        f"{prefix}tokens": "{" + ",".join(str(r[5]) for r in rows) + "}",
    }


def _without_comments(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--")).strip().rstrip(";")


def combined_statement(schema: str, keep_done: bool) -> str:
    """The completion of the previous batch as CTEs of the claim: one statement per batch.
    Its rows are the claimed jobs (`done` NULL), then one row per completed id."""
    claim = _without_comments(statements(schema)["claim_take"].as_string(None))
    limited, sep, update = claim.removeprefix("WITH limited AS MATERIALIZED (").partition("\n)\n")
    assert sep and limited != claim, "the claim no longer starts with its `limited` CTE: update this benchmark"
    update, _, returning = update.partition("RETURNING ")
    returning = returning.replace("j.payload::text", "j.payload::text AS payload").replace(
        "j.meta::text", "j.meta::text AS meta"
    )
    complete = _without_comments(
        statements(schema)["claim_complete" if keep_done else "claim_complete_deleting"].as_string(None)
    )
    for name in ("ids", "leases"):
        complete = complete.replace(f"%({name})s", f"%(done_{name})s")
    if keep_done:
        finished = f"finished AS ({complete})"
    else:
        ctes, sep, _ = complete.removeprefix("WITH ").rpartition("SELECT id FROM gone")
        assert sep, "complete_deleting changed shape: update this benchmark"
        finished = ctes.rstrip() + ", finished AS (SELECT id FROM gone)"  # noqa: S608 (sql/claims.sql's own text)
    columns = ["id", "type", "payload", "attempts", "max_attempts", "lease_token", "locked_until", "created_at",
               "run_at", "uncounted", "meta"]  # fmt: skip
    return (
        f"WITH {finished},\nlimited AS MATERIALIZED ({limited}\n),\nclaimed AS ({update}RETURNING {returning})\n"
        f"SELECT {', '.join(columns)}, NULL::bigint AS done FROM claimed\nUNION ALL\n"
        f"SELECT {', '.join('NULL' for _ in columns)}, id FROM finished"
    )


class Loop:
    """One way of draining, on a connection of its own."""

    def __init__(self, name: str, dsn: str, schema: str, batch: int, keep_done: bool) -> None:
        self.name = name
        self.conn = psycopg.connect(dsn, autocommit=True)
        # A worker's claiming connection's own settings: without `jit` off there, the planner
        # settings would price the claim high enough to compile it at every execution.
        self.conn.execute(statements(schema)["claim_session"])
        row = self.conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        self.pid = int(row[0])
        self.cur = self.conn.cursor(binary=True)
        self.batch = batch
        self.params = claim_params(batch, f"bench-{name}")
        self.schema = schema
        q = statements(schema)
        self.claim = q["claim_take"]
        if name == "hot":
            text = self.claim.as_string(None).replace(
                "WHERE status = 'ready' AND run_at <= now()",
                "WHERE status = 'ready' AND finished_at IS NULL AND run_at <= now()",
            )
            assert "finished_at IS NULL" in text, "the claim's ready filter changed: update this benchmark"
            self.claim = sql.SQL(text)  # type: ignore[arg-type,unused-ignore]
        if name == "raw-claim":
            self.claim = sql.SQL(RAW_CLAIM_MINIMAL.replace("jobtui.job", f"{schema}.job"))  # type: ignore[arg-type,unused-ignore]
            self.params = (  # type: ignore[assignment]
                [None],
                [JOB_TYPE],
                DEFAULT_MAX_ATTEMPTS,
                f"bench-{name}",
                30.0,
                [JOB_TYPE],
                batch,
            )
        self.complete = q["claim_complete" if keep_done else "claim_complete_deleting"]
        if name in FENCES:
            text = self.complete.as_string(None)
            assert FENCE in text, "the completion's fence changed: update this benchmark"
            self.complete = sql.SQL(text.replace(FENCE, FENCES[name]))  # type: ignore[arg-type,unused-ignore]
        self.combined = sql.SQL(combined_statement(schema, keep_done)) if name == "combined" else None  # type: ignore[arg-type,unused-ignore]
        self.held: list[Any] = []  # the claimed batch not yet completed (pipelined loops)
        self.server = 0.0
        self.client = 0.0
        self.elapsed = 0.0
        self.done = 0

    def turn(self, jobs: int) -> None:
        """Complete `jobs` jobs (a multiple of the batch), clocks running."""
        step: Callable[[], tuple[int, bool]] = {
            "two": self._two,
            "hot": self._two,
            "raw-claim": self._two,
            "fence-array": self._two,
            "fence-dense": self._two,
            "pipeline": lambda: self._pipelined(True),
            "pipeline-autocommit": lambda: self._pipelined(False),
            "combined": self._combined,
        }[self.name]
        s0, c0, t0 = backend_cpu(self.pid), time.process_time(), time.perf_counter()
        n = 0
        more = True
        while n < jobs and more:
            completed, more = step()
            n += completed
        self.elapsed += time.perf_counter() - t0
        self.client += time.process_time() - c0
        self.server += backend_cpu(self.pid) - s0
        self.done += n

    def finish(self) -> None:
        """Complete the batch a pipelined loop still holds (none is left once a loop drained)."""
        if self.held:
            self.cur.execute(self.complete, lease_params(self.held))
            self.held = []

    def _two(self) -> tuple[int, bool]:
        """(jobs completed, whether there may be more)"""
        self.cur.execute(self.claim, self.params)
        rows = self.cur.fetchall()
        if not rows:
            return 0, False
        params = lease_params(rows)
        if self.name == "fence-dense":
            by_id = {r[0]: r[5] for r in rows}
            lo, hi = min(by_id), max(by_id)
            params["dense"] = f"[{lo}:{hi}]={{" + ",".join(str(by_id.get(i, 0)) for i in range(lo, hi + 1)) + "}"
        self.cur.execute(self.complete, params)
        return len(self.cur.fetchall()), True

    def _pipelined(self, one_transaction: bool) -> tuple[int, bool]:
        held = self.held
        done_cur = self.conn.cursor(binary=True) if held else None
        claim_cur = self.conn.cursor(binary=True)
        with self.conn.pipeline(), self.conn.transaction() if one_transaction else nullcontext():
            if done_cur is not None:
                done_cur.execute(self.complete, lease_params(held))
            claim_cur.execute(self.claim, self.params)
        completed = len(done_cur.fetchall()) if done_cur is not None else 0
        self.held = claim_cur.fetchall()
        return completed, bool(self.held or held)

    def _combined(self) -> tuple[int, bool]:
        assert self.combined is not None
        held = self.held
        self.cur.execute(self.combined, {**self.params, **lease_params(held, "done_")})
        rows = self.cur.fetchall()
        self.held = [r for r in rows if r[-1] is None]
        return len(rows) - len(self.held), bool(self.held or held)

    def close(self) -> None:
        self.conn.close()


def fill(dsn: str, schema: str, jobs: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("TRUNCATE {}.job").format(sql.Identifier(schema)))
    with Client(dsn, schema=schema) as client:
        for start in range(0, jobs, 10_000):
            client.enqueue_many([NewJob(JOB_TYPE) for _ in range(min(10_000, jobs - start))])
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("VACUUM ANALYZE {}.job").format(sql.Identifier(schema)))


def hot_updates(dsn: str, schema: str) -> tuple[int, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE schemaname = %s AND relname = 'job'",
            (schema,),
        ).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("JOBTUI_BENCH_DSN", DEFAULT_DSN))
    parser.add_argument("--jobs", type=int, default=40_000, help="jobs per loop per round")
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--slice", type=int, default=2000, help="jobs per turn")
    parser.add_argument("--keep-done", action="store_true", help="complete into done rows (default: delete and tally)")
    parser.add_argument("--loops", default=",".join(LOOPS))
    parser.add_argument("--hot-fillfactor", type=int, default=80)
    parser.add_argument("--dbname", default=BENCH_DB)
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.loops.split(",") if n.strip()]
    if unknown := set(names) - set(LOOPS):
        parser.error(f"unknown loops {sorted(unknown)}; choose from {', '.join(LOOPS)}")
    if args.jobs % args.batch or args.slice % args.batch:
        parser.error("--jobs and --slice must be multiples of --batch")
    if not args.dbname.startswith("jobtui_bench"):
        parser.error("--dbname must start with jobtui_bench (the database is dropped at the end)")

    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(args.dbname)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(args.dbname)))
    dsn = with_dbname(args.dsn, args.dbname)
    schemas = {name: f"bench_{name.replace('-', '_')}" for name in names}
    figures: dict[str, dict[str, list[float]]] = {n: {"rate": [], "server": [], "client": []} for n in names}
    hot: tuple[int, int] = (0, 0)
    print(
        f"{len(names)} loops, {args.jobs:,} jobs each per round, batch {args.batch}, turns of {args.slice:,}, "
        f"{'done rows kept' if args.keep_done else 'completed by delete and tally'}, {os.cpu_count()} CPUs"
    )
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for name, schema in schemas.items():
                migrate(conn, schema)
                if name == "hot":
                    text = HOT_INDEXES.format(
                        schema=sql.Identifier(schema).as_string(conn), fillfactor=args.hot_fillfactor
                    )
                    conn.execute(text.encode())
        for r in range(args.rounds):
            for schema in schemas.values():
                fill(dsn, schema, args.jobs)
            before = hot_updates(dsn, schemas["hot"]) if "hot" in schemas else (0, 0)
            loops = [Loop(n, dsn, schemas[n], args.batch, args.keep_done) for n in names]
            try:
                turn = 0
                while any(loop.done < args.jobs for loop in loops):
                    order = loops[turn % len(loops) :] + loops[: turn % len(loops)]
                    turn += 1
                    for loop in order:
                        if loop.done < args.jobs:
                            loop.turn(min(args.slice, args.jobs - loop.done))
                    if turn > 10 * (args.jobs // args.slice + 1) * len(loops):
                        raise RuntimeError("the loops did not finish")
                for loop in loops:
                    loop.finish()
            finally:
                for loop in loops:
                    loop.close()
            if "hot" in schemas:
                # Closed backends report their counts a moment later.
                deadline = time.monotonic() + 10
                after = hot_updates(dsn, schemas["hot"])
                while after[0] - before[0] < args.jobs and time.monotonic() < deadline:
                    time.sleep(0.2)
                    after = hot_updates(dsn, schemas["hot"])
                hot = (after[0] - before[0], after[1] - before[1])
            line = []
            for loop in loops:
                f = figures[loop.name]
                f["rate"].append(loop.done / loop.elapsed)
                f["server"].append(loop.server / loop.done * 1e6)
                f["client"].append(loop.client / loop.done * 1e6)
                line.append(f"{loop.name} {f['rate'][-1]:,.0f}/s {f['server'][-1]:.1f}+{f['client'][-1]:.1f} us")
            print(f"round {r + 1}: " + ", ".join(line) + f" (load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(args.dbname)))
    print()
    base = names[0]
    med = {n: {k: statistics.median(v) for k, v in figures[n].items()} for n in names}
    print(f"{'loop':<20} | {'jobs/s':>8} | {'server us/job':>13} | {'client us/job':>13} | vs {base}")
    for n in names:
        ratio = [a / b for a, b in zip(figures[n]["rate"], figures[base]["rate"], strict=True)]
        print(f"{n:<20} | {med[n]['rate']:>8,.0f} | {med[n]['server']:>13.1f} | {med[n]['client']:>13.1f} | "
              f"rate {statistics.median(ratio):.2f}x (paired)")  # fmt: skip
    if "hot" in schemas:
        print(f"hot: {hot[1]:,} of {hot[0]:,} updates HOT in the last round")
    return 0


if __name__ == "__main__":
    sys.exit(main())
