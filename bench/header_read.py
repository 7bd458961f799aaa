"""What one console refresh costs with the header's read alone, beside the Queues pane's.

    .venv/bin/python bench/header_read.py [--dsn DSN] [--rounds 5] [--fetches 40]
        [--tree NAME=PATH ...] [--keep] [--reuse]

The database is bench/console_refresh.py's big size (5,000,000 ready jobs scattered over the
table's order, 1,000,000 done over 24 h, dead, running, a fleet of 1,000), plus a busy
fleet's last minute: 30,000 of the done rows, scattered over the table, get a finished_at in
the minute ahead, so they count as done in the last minute for the whole run (a fleet that
finishes 500 jobs a second and keeps its done rows).

Each configuration is a fresh process that makes the console's DataSource refresh `--fetches`
times after three warm-ups, and reports the median refresh and the CPU its database backend
used per refresh (/proc/PID/stat of the backend; the server must be local). The
configurations take turns, round by round:

- `header`: this checkout, off the Queues pane (the header's read: no done jobs by queue);
- `queues`: this checkout, the Queues pane open;
- each `--tree NAME=PATH`: another checkout's refresh, as its console makes it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from console_refresh import DEFAULT_DSN, prepare  # noqa: E402

BENCH_DB = "jobtui_bench_header"
SCHEMA = "big"
BUSY = 30_000

LAST_MINUTE = """
UPDATE big.job SET finished_at = now() + interval '1 hour' + (id %% 59) * interval '1 second'
WHERE id IN (SELECT id FROM big.job WHERE status = 'done' AND id %% 33 = 0 LIMIT %s)
"""


def ticks(pid: int) -> int:
    """User and system CPU of a process, in clock ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def child(dsn: str, queues_open: bool, fetches: int) -> None:
    """One configuration's refreshes, in this process; prints one JSON line."""
    from jobtui.tui.data import DataSource

    source = DataSource(dsn, SCHEMA)
    source.done_wanted = queues_open
    try:
        for _ in range(3):
            source.fetch()
        pid = source.backend_pid()
        times = []
        before = ticks(pid)
        for _ in range(fetches):
            start = time.perf_counter()
            source.fetch()
            times.append((time.perf_counter() - start) * 1000)
        used = (ticks(pid) - before) / os.sysconf("SC_CLK_TCK") * 1000
    finally:
        source.close()
    print(json.dumps({"median_ms": statistics.median(times), "backend_ms": used / fetches}))


def run_one(tree: Path, dsn: str, queues_open: bool, fetches: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    args = [sys.executable, str(HERE / "header_read.py"), "--child", "--dsn", dsn, "--fetches", str(fetches)]
    out = subprocess.run(
        [*args, *(["--queues-open"] if queues_open else [])],
        env=env,
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    )
    got: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--fetches", type=int, default=40)
    parser.add_argument("--tree", action="append", default=[], help="NAME=PATH of another checkout")
    parser.add_argument("--keep", action="store_true", help="keep the bench database afterwards")
    parser.add_argument("--reuse", action="store_true", help="measure the database an earlier --keep left")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--queues-open", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.dsn, args.queues_open, args.fetches)
        return
    dsn = prepare(args.dsn, BENCH_DB, [SCHEMA], args.reuse, fleet=1000)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(LAST_MINUTE, (BUSY,))
        conn.execute("VACUUM ANALYZE big.job")
    here = HERE.parent
    configs: list[tuple[str, Path, bool]] = [("header", here, False), ("queues", here, True)]
    configs += [(name, Path(path).resolve(), False) for name, path in (t.split("=", 1) for t in args.tree)]
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in configs}
    try:
        for r in range(args.rounds):
            turn = configs[r % len(configs) :] + configs[: r % len(configs)]
            for name, tree, queues_open in turn:
                got = run_one(tree, dsn, queues_open, args.fetches)
                results[name].append(got)
                load = os.getloadavg()[0]
                print(
                    f"round {r + 1} {name}: refresh {got['median_ms']:.1f} ms, backend {got['backend_ms']:.2f} ms"
                    f" per refresh (load {load:.1f})",
                    flush=True,
                )
    finally:
        if not args.keep:
            with psycopg.connect(args.dsn, autocommit=True) as admin:
                admin.execute(f"DROP DATABASE IF EXISTS {BENCH_DB} WITH (FORCE)")
    print()
    print("configuration | refresh ms (median of rounds) | backend ms per refresh (median of rounds)")
    for name, runs in results.items():
        refresh = statistics.median(g["median_ms"] for g in runs)
        backend = statistics.median(g["backend_ms"] for g in runs)
        print(f"{name:13} | {refresh:29.1f} | {backend:.2f}")
    base = results["queues"]
    for name, runs in results.items():
        if name == "queues":
            continue
        ratios = [a["backend_ms"] / b["backend_ms"] for a, b in zip(runs, base, strict=True) if b["backend_ms"] > 0]
        if ratios:
            print(f"{name} against queues, paired by round: backend {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
