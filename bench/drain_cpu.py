"""Where a drain's CPU goes: jobtui's workers beside the raw loop, worker and server, per job.

    .venv/bin/python bench/drain_cpu.py [--dsn DSN] [--jobs 200000] [--workers 2]
                                        [--concurrency 200] [--rounds 3] [--delete-on-complete]
                                        [--configs jobtui,raw-exact,raw-minimal,raw-overlap]
                                        [--tree NAME=PATH ...]

A benchmark, not a test. In its own database (jobtui_bench_drain_cpu, dropped afterwards),
each round drains --jobs no-op jobs once per configuration, the configurations taking turns
(their order rotating each round):

    jobtui      --workers `jobtui worker` processes, --concurrency each
    raw-exact   --workers processes of the raw psycopg loop of bench/core.py, claims of
                --concurrency, jobtui's table (with --delete-on-complete it completes by
                delete and tally, as jobtui's workers do), sending jobtui's own claim and
                complete statements (read from jobtui/kernel/sql/claims.sql): jobtui's gap to
                it is jobtui's Python
    raw-minimal the same loop with the minimal claim, no lever work (no pause, limit or rate,
                no queue filter): its gap to raw-exact is the server's lever work
    raw-overlap raw-exact with its completions on a second connection, written by a thread
                while the next claim runs, as jobtui's producer and completer overlap, at
                most two claims held uncompleted: its gap to raw-exact is what the overlap
                costs the server
    NAME        with --tree NAME=PATH, `jobtui worker` processes running the jobtui of the
                source tree PATH (started in PATH, with PYTHONPATH=PATH): a commit before a
                change, checked out with `git worktree add`, against the change in one run.
                Before it starts, the script checks which jobtui a worker started so imports.

The processes start with the queue paused (jobtui) or waiting for a line on stdin (raw); once
their CPU time stops moving (imports done, connected), the readings start and the queue is
resumed. Once it is empty the script reads:

- the drain rate, jobs / (last finished_at - first started_at), on the database's clock;
- worker CPU: the processes' utime + stime from /proc since the start, per job;
- server CPU: the same for the backends of the bench database (the workers' connections),
  per job; and, apart, for the server's background processes (WAL writer, checkpointer,
  background writer), which other databases on the server share.

On a machine whose CPUs are all busy during a drain, the rate is about the number of CPUs
divided by the worker's and the server's CPU per job: the columns say which side to work on,
and how far jobtui is from what the database itself costs. Medians over the rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from jobtui import Client, NewJob
from jobtui.cli.bench import NOOP as JOB_TYPE
from jobtui.cli.bench import spawn_workers, stop_workers
from jobtui.core.bench import drain_window, queue_busy
from jobtui.kernel.migrate import migrate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from core import RawLoop  # bench/ is not a package

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
BENCH_DB = "jobtui_bench_drain_cpu"
SCHEMA = "jobtui"
# The source tree of this script: the `jobtui` configuration runs its code.
REPOSITORY = str(Path(__file__).resolve().parent.parent)
TICKS = os.sysconf("SC_CLK_TCK")
BACKGROUND = ("walwriter", "checkpointer", "background writer")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, or 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


RAW = ("raw-exact", "raw-minimal", "raw-overlap")


def raw_loop(dsn: str, batch: int, worker: str, delete: bool, config: str) -> None:
    """bench/core.py's raw loop, from a line on stdin until a claim finds nothing."""
    overlap = config == "raw-overlap"
    loop = RawLoop(dsn, job_type=JOB_TYPE, worker=worker, delete=delete, exact=config != "raw-minimal", overlap=overlap)
    try:
        sys.stdin.readline()
        if overlap:
            loop.drain_overlapped(batch)
        else:
            loop.drain(batch)
    finally:
        loop.close()


@dataclass
class Reading:
    """CPU seconds by process, the highest seen (a process that exits keeps its last)."""

    start: dict[int, float] = field(default_factory=dict)
    last: dict[int, float] = field(default_factory=dict)

    def sample(self, pids: list[int]) -> None:
        for pid in pids:
            cpu = cpu_seconds(pid)
            self.start.setdefault(pid, cpu)
            self.last[pid] = max(self.last.get(pid, 0.0), cpu)

    def used(self) -> float:
        return sum(cpu - self.start[pid] for pid, cpu in self.last.items())


def backends(conn: psycopg.Connection[Any], dbname: str) -> tuple[list[int], list[int]]:
    """(pids of the bench database's other backends, pids of the server's background processes)."""
    rows = conn.execute(
        "SELECT pid, datname = %s AND pid <> pg_backend_pid(), backend_type = ANY(%s) FROM pg_stat_activity",
        (dbname, list(BACKGROUND)),
    ).fetchall()
    return [int(r[0]) for r in rows if r[1]], [int(r[0]) for r in rows if r[2]]


def settled(pids: list[int], longest: float = 30.0) -> None:
    """Until the processes' CPU time stops moving for half a second (imports done, connected)."""
    deadline = time.monotonic() + longest
    before = sum(cpu_seconds(p) for p in pids)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = sum(cpu_seconds(p) for p in pids)
        if now - before < 0.02:
            return
        before = now
    raise SystemExit("the workers did not settle within 30 s")


PAUSE = "INSERT INTO jobtui.queue_control (kind, name, paused_at, paused_by, changed_by) VALUES ('queue', 'default', now(), 'bench', 'bench')"  # noqa: E501
RESUME = "DELETE FROM jobtui.queue_control WHERE kind = 'queue' AND name = 'default'"


def tree_env(tree: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": tree}


def imported_from(tree: str) -> str:
    """Where a worker started for `tree` imports jobtui from, asked the way it is started."""
    found = subprocess.run(
        [sys.executable, "-c", "import jobtui; print(jobtui.__file__)"],
        cwd=tree, env=tree_env(tree), capture_output=True, text=True, check=True,
    )  # fmt: skip
    return str(Path(found.stdout.strip()).parent.parent)


def one_drain(dsn: str, dbname: str, config: str, trees: dict[str, str], args: argparse.Namespace) -> tuple[float, ...]:
    """(jobs/s, worker us/job, server us/job, background us/job) of one drain from a fresh table."""
    jobs = args.jobs
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE jobtui.job, jobtui.done_tally, jobtui.queue_control")
    with Client(dsn) as client:
        for start in range(0, jobs, 10_000):
            client.enqueue_many([NewJob(JOB_TYPE) for _ in range(min(10_000, jobs - start))])
    with psycopg.connect(dsn, autocommit=True) as conn, tempfile.TemporaryFile() as log:
        conn.execute("VACUUM ANALYZE jobtui.job")
        conn.execute("CHECKPOINT")
        if config in RAW:
            cmds = [
                [sys.executable, __file__, "--raw-loop", dsn, str(args.concurrency), f"raw-{i}",
                 "delete" if args.delete_on_complete else "keep", config]
                for i in range(args.workers)
            ]  # fmt: skip
            procs = [
                subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=log) for cmd in cmds
            ]
        else:
            conn.execute(PAUSE)
            tree = trees.get(config, REPOSITORY)
            procs = spawn_workers(
                dsn, SCHEMA, args.workers, args.concurrency, log,
                delete_on_complete=args.delete_on_complete, env=tree_env(tree), cwd=tree,
            )  # fmt: skip
        try:
            settled([p.pid for p in procs])
            time.sleep(0.5)  # their connections are open
            workers, server, background = Reading(), Reading(), Reading()
            own, shared = backends(conn, dbname)
            workers.sample([p.pid for p in procs])
            server.sample(own)
            background.sample(shared)
            if config in RAW:
                for p in procs:
                    assert p.stdin is not None
                    p.stdin.write(b"go\n")
                    p.stdin.close()
            else:
                conn.execute(RESUME)
                conn.execute(sql.SQL("NOTIFY {}").format(sql.Identifier(f"{SCHEMA}.job")))
            while True:
                workers.sample([p.pid for p in procs])
                own, shared = backends(conn, dbname)
                server.sample(own)
                background.sample(shared)
                if not queue_busy(conn, SCHEMA) and drain_window(conn, SCHEMA)[0] >= jobs:
                    break
                if any(p.poll() not in (None, 0) for p in procs):
                    log.seek(0)
                    raise SystemExit(
                        f"{config}: a worker process failed:\n" + log.read().decode(errors="replace")[-2000:]
                    )
                time.sleep(0.05)
            workers.sample([p.pid for p in procs])
            server.sample(backends(conn, dbname)[0])
            background.sample(backends(conn, dbname)[1])
            finished, span = drain_window(conn, SCHEMA)
        finally:
            stop_workers(procs)
    rate = finished / span if span else 0.0
    return rate, workers.used() / jobs * 1e6, server.used() / jobs * 1e6, background.used() / jobs * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("JOBTUI_BENCH_DSN", DEFAULT_DSN))
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=200, help="per worker; the raw loop's batch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--delete-on-complete", action="store_true", help="finished jobs are deleted and tallied (raw loop too)"
    )
    parser.add_argument(
        "--configs",
        default="jobtui,raw-exact,raw-minimal",
        help="comma-separated: jobtui, raw-exact, raw-minimal, raw-overlap, and the --tree names",
    )
    parser.add_argument(
        "--tree", action="append", default=[], metavar="NAME=PATH", help="also run the jobtui of source tree PATH"
    )
    parser.add_argument("--dbname", default=BENCH_DB)
    args = parser.parse_args(argv)
    trees = {}
    for spec in args.tree:
        name, sep, path = spec.partition("=")
        if not sep or not (Path(path) / "jobtui" / "__init__.py").is_file() or name in ("jobtui", *RAW):
            parser.error(f"--tree {spec!r}: write NAME=PATH, PATH a source tree holding jobtui/")
        trees[name] = str(Path(path).resolve())
    for name, tree in {"jobtui": REPOSITORY, **trees}.items():
        if (found := imported_from(tree)) != tree:
            parser.error(f"{name}: a worker started in {tree} imports the jobtui of {found}")
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    for name in trees:
        if name not in configs:
            configs.append(name)
    if unknown := [c for c in configs if c not in ("jobtui", *RAW, *trees)]:
        parser.error(f"unknown configurations {unknown}")
    if not args.dbname.startswith("jobtui_bench"):
        parser.error("--dbname must start with jobtui_bench (the database is dropped at the end)")

    params = conninfo_to_dict(args.dsn)
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(args.dbname)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(args.dbname)))
    params["dbname"] = args.dbname
    dsn = make_conninfo(**params)  # type: ignore[arg-type]
    done = "--delete-on-complete (raw: delete and tally)" if args.delete_on_complete else "done rows kept"
    print(f"{args.workers} processes each, concurrency (raw: batch) {args.concurrency}, {done}, "
          f"{args.jobs:,} jobs, {os.cpu_count()} CPUs; trees: {trees or 'none'}")  # fmt: skip
    figures: dict[str, list[tuple[float, ...]]] = {c: [] for c in configs}
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate(conn)
        for r in range(args.rounds):
            for config in configs[r % len(configs) :] + configs[: r % len(configs)]:
                fig = one_drain(dsn, args.dbname, config, trees, args)
                figures[config].append(fig)
                print(f"round {r + 1} {config}: drain {fig[0]:,.0f} jobs/s, worker {fig[1]:.1f} us/job, "
                      f"server {fig[2]:.1f} us/job, background {fig[3]:.1f} us/job "
                      f"(load {os.getloadavg()[0]:.1f})", flush=True)  # fmt: skip
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(args.dbname)))
    print()
    print(f"{'configuration':<14} | {'drain jobs/s':>12} | {'worker us/job':>13} | {'server us/job':>13} | "
          f"{'background':>10} | {'worker+server':>13}")  # fmt: skip
    for config in configs:
        rate, worker, server, background = (statistics.median(col) for col in zip(*figures[config], strict=True))
        print(f"{config:<14} | {rate:>12,.0f} | {worker:>13.1f} | {server:>13.1f} | {background:>10.1f} | "
              f"{worker + server:>13.1f}")  # fmt: skip
    for raw in RAW:
        if raw in figures and "jobtui" in figures:
            pairs = list(zip(figures["jobtui"], figures[raw], strict=True))
            share = statistics.median(j[0] / r[0] for j, r in pairs)
            cpu = statistics.median(j[2] / r[2] for j, r in pairs)
            print(f"jobtui against {raw}, paired by round: drain {share:.0%}, server CPU per job {cpu:.2f}x")
    for name in trees:
        if "jobtui" in figures and name in figures:
            pairs = list(zip(figures["jobtui"], figures[name], strict=True))
            rate = statistics.median(j[0] / t[0] for j, t in pairs)
            cpu = statistics.median(j[1] / t[1] for j, t in pairs)
            faster = sum(j[0] > t[0] for j, t in pairs)
            print(f"jobtui against {name}, paired by round: drain {rate:.2f}x, worker CPU per job {cpu:.2f}x; "
                  f"jobtui drained faster in {faster} of {len(pairs)} rounds")  # fmt: skip
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "--raw-loop":
        raw_loop(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5] == "delete", sys.argv[6])
    else:
        sys.exit(main())
