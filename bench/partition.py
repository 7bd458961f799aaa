"""Silent network partitions of a worker, and what it does after the heal.

    .venv/bin/python bench/partition.py [--seconds 45 120] [--executor thread process] [--runs 1]
                                        [--pgbouncer]

Each run builds tests/netns.py's topology (root and iproute2 needed), cuts worker A off for
the given seconds while it holds running jobs, heals, and times A's first job done after the
heal; it prints one line per run (tests/chaos/partition.py says what is checked) and exits 1
when a run broke a promise. Logs go to a temporary directory, named at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make `tests` importable
    sys.path.insert(0, str(ROOT))

from tests.chaos.partition import Result, run_partition  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, nargs="+", default=[45.0, 120.0])
    parser.add_argument("--executor", nargs="+", choices=("thread", "process"), default=["thread", "process"])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--pgbouncer", action="store_true", help="worker A through PgBouncer in transaction mode")
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="jobtui-partition-"))
    results: list[Result] = []
    for seconds in args.seconds:
        for executor in args.executor:
            for n in range(args.runs):
                log_dir = logs / f"{seconds:g}s-{executor}-{n}"
                log_dir.mkdir()
                result = run_partition(seconds, executor, log_dir=log_dir, pooler=args.pgbouncer)
                results.append(result)
                print(result.line(), flush=True)
    for seconds in args.seconds:
        for executor in args.executor:
            backs = [r.back_after for r in results if r.seconds == seconds and r.executor.startswith(executor)]
            median = statistics.median(backs)
            print(f"{seconds:g}s {executor}: back after the heal, median {median:.1f}s of {len(backs)}")
    print(f"logs: {logs}")
    return 1 if any(r.problems for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
