"""The worker's own CPU per job, without a database: what its Python code costs.

    .venv/bin/python bench/worker_overhead.py [--jobs 200000] [--concurrency 200] [--rounds 7]
                                              [--gc-threshold N] [--loop auto|asyncio|uvloop,...]

A benchmark, not a test. It runs a real `Worker` (the no-op handler of `jobtui bench`,
--delete-on-complete) in this process, with its connections replaced by one that answers
every claim at once with rows as PostgreSQL would return them and every outcome write with
success. What is left is the worker's own per-job work: records, tasks, the event loop,
batching of outcomes, and the collector. The process CPU time of each run over the jobs,
min and median of the rounds: a figure steady to a few percent on a busy machine, where a
drain's rate moves by a third. psycopg's share (sending statements, loading rows) is not in
it; `bench/drain_cpu.py` measures the whole worker against a real server.

--gc-threshold sets the collector's first threshold as `jobtui worker` does (its value by
default); 700 is Python's default. --loop names the event loops to run on, as `jobtui worker
--loop` does; with several, each round runs one worker on each, in turns.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
from datetime import UTC, datetime
from typing import Any

import jobtui.worker
import jobtui.worker.worker
from jobtui.cli.bench import NOOP, jobs
from jobtui.cli.eventloop import loop_factory, run_on
from jobtui.cli.run import WORKER_GC_THRESHOLD
from jobtui.kernel.db import Call, Rows

NOW = datetime.now(UTC)
# The columns the claim and reap statements return, as PostgreSQL names them.
CLAIM_COLUMNS = (
    "id", "type", "payload", "attempts", "max_attempts", "lease_token", "locked_until", "created_at", "run_at",
    "uncounted", "meta", "queue",
)  # fmt: skip
REAP_COLUMNS = ("job_id", "type", "worker", "attempt", "status", "at", "queue")


class InstantDatabase:
    """Stands in for jobtui.kernel.link.Connection: claims hand out the next ids, writes succeed."""

    def __init__(self, worker: list[jobtui.worker.Worker], total: int) -> None:
        self._worker = worker
        self._left = total
        self._next_id = 1
        self._written = 0
        self._total = total

    def __call__(self, dsn: str, role: str, **_: Any) -> InstantDatabase:
        self._role = role
        return self  # one object serves every connection the worker opens

    async def run(self, call: Call[Any], schema: str, stopping: asyncio.Event | None = None, **_: Any) -> Any:
        return (await self.run_timed(call, schema, stopping))[0]

    async def run_timed(
        self, call: Call[Any], schema: str, stopping: asyncio.Event | None = None, **_: Any
    ) -> tuple[Any, float]:
        sent = time.monotonic()
        await asyncio.sleep(0)  # a statement always yields to the loop
        if call.name == "claim_take":
            n = min(call.params["limit"], self._left)
            self._left -= n
            first, self._next_id = self._next_id, self._next_id + n
            # The claim's columns: id, type, payload text, attempts, max_attempts, token, 3 timestamps,
            # uncounted, meta, queue.
            rows = [(i, NOOP, "{}", 1, 25, 1, NOW, NOW, NOW, 0, None, "default") for i in range(first, first + n)]
            return call.decode(Rows(rows, CLAIM_COLUMNS)), sent
        if call.name in ("claim_complete_deleting", "claim_complete", "claim_heartbeat"):
            ids = call.params["ids"]
            if isinstance(ids, str):  # a bigint[] literal, as core/claims.py sends them
                ids = [int(i) for i in ids.strip("{}").split(",")] if ids != "{}" else []
            if call.name != "claim_heartbeat":
                self._written += len(ids)
                if self._written >= self._total:
                    self._worker[0].stop()
            return set(ids), sent
        if call.name == "claim_reap":
            return call.decode(Rows([(None, None, None, None, "open", NOW, None)], REAP_COLUMNS)), sent
        if call.name == "privileges_missing":
            return [], sent
        if call.name in ("member_register", "member_refresh"):  # the worker's row in the fleet
            return call.decode(Rows([(1, "running", 0, None)], ("id", "wanted", "orders", "ordered_by"))), sent
        if call.name == "member_leave":
            return call.decode(Rows([(1,)], ("id",))), sent
        raise AssertionError(f"unexpected statement {call.name}")

    async def get(self, stopping: asyncio.Event | None = None) -> Any:
        await asyncio.Event().wait()  # the LISTEN loop waits here for good

    def lost(self, exc: BaseException) -> None:
        pass

    async def close(self) -> None:
        pass


def one_run(total: int, concurrency: int, loop: str) -> float:
    """CPU seconds per job of one worker run over `total` jobs."""
    holder: list[jobtui.worker.Worker] = []
    jobtui.worker.worker.Connection = InstantDatabase(holder, total)  # type: ignore[misc,assignment]
    worker = jobtui.worker.Worker(
        jobs, "postgresql://unused", concurrency=concurrency, scheduler=False, retention=None, delete_on_complete=True
    )
    holder.append(worker)
    start = time.process_time()
    run_on(loop_factory(loop), worker.run())
    if worker.counts["done"] != total:
        raise RuntimeError(f"{worker.counts['done']} of {total} jobs done")
    return (time.process_time() - start) / total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--gc-threshold", type=int, default=WORKER_GC_THRESHOLD)
    parser.add_argument("--loop", default="auto", help="comma-separated: auto, asyncio, uvloop (default auto)")
    args = parser.parse_args(argv)
    loops = [name.strip() for name in args.loop.split(",") if name.strip()]
    for name in loops:
        loop_factory(name)  # an unknown name, or uvloop missing, stops here
    gc.set_threshold(args.gc_threshold, *gc.get_threshold()[1:])
    per_job: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(args.rounds):
        for name in loops:
            per_job[name].append(one_run(args.jobs, args.concurrency, name) * 1e6)
    for name, runs in per_job.items():
        print(
            f"worker CPU per job, no database, loop {name}: min {min(runs):.2f} us, "
            f"median {statistics.median(runs):.2f} us ({args.rounds} rounds of {args.jobs:,} jobs, "
            f"concurrency {args.concurrency}, gc threshold {args.gc_threshold})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
