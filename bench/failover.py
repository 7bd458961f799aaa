"""A failover mid-drain, measured: the primary crashes, its synchronous standby is promoted,
and worker processes on a multi-host DSN carry on there.

    .venv/bin/python bench/failover.py [--jobs 5000] [--workers 2] [--concurrency 20] [--rounds 1]

A benchmark, not a test (tests/chaos/test_failover.py runs the same with checks): each round
makes a primary and a pg_basebackup standby of its own on free ports (tests/topology.py),
with synchronous replication, drains --jobs effect jobs, stops the primary (immediate mode)
once 30 % are done, promotes the standby, waits for the rest, and prints: the jobs done, the
effects recorded and how many distinct, the most attempts a job used, the workers' ERROR
lines, the time from the stop to the standby accepting writes (`pg_ctl promote -w`
returned), and from the start of the promotion to the first claim on the new primary (the
standby's clock). Exit code 1 when a job or an effect is
missing or doubled. Both clusters are stopped and removed at the end.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make `tests` importable
    sys.path.insert(0, str(ROOT))

from tests.failover import run_failover  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    # SIGTERM ends the run through the finally blocks: workers and clusters go.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    print(f"{'jobs':>6} {'done':>6} {'effects':>8} {'distinct':>8} {'attempts':>8} {'errors':>6} {'promote s':>9} "
          f"{'to claim s':>10} {'drain s':>8}")  # fmt: skip
    failed = False
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="jobtui-bench-failover-") as tmp:
            r = run_failover(jobs=args.jobs, workers=args.workers, concurrency=args.concurrency, logs=Path(tmp))
        failed = failed or not (r.done == r.effects == r.distinct_effects == r.jobs)
        print(
            f"{r.jobs:>6} {r.done:>6} {r.effects:>8} {r.distinct_effects:>8} {r.most_attempts:>8}"
            f" {r.errors_logged:>6} {r.promotion_seconds:>9.2f} {r.promotion_to_first_claim:>10.3f}"
            f" {r.drain_seconds:>8.1f}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
