"""What `jobtui bench` asks of its schema: whether it may use it, its mark, how the drain
went and how long the latency jobs waited. The one module that names the statements of
sql/bench.sql; cli/bench.py runs the benchmark.

    claim_schema(conn, "jobtui_bench")
    jobs, seconds = drain_window(conn, "jobtui_bench")
"""

from __future__ import annotations

from typing import Any

from jobtui.kernel.db import Call, Rows, run
from jobtui.kernel.errors import InvalidInput

BENCH_SCHEMA = "jobtui_bench"
# Marks a schema this benchmark made (and drops when it ends): the only kind it drops.
MARK = "jobtui bench: dropped when the benchmark ends"


def _scalar(rows: Rows) -> Any:
    return rows[0][0] if rows else None


def _nothing(rows: Rows) -> None:
    return None


def drain_window(conn: Any, schema: str) -> tuple[int, float]:
    """(jobs finished, seconds from the first start to the last finish), from the done rows
    and from the tallies of jobs deleted at completion."""
    jobs, span = run(conn, Call("bench_drain_window", {}, lambda rows: rows[0]), schema)
    return int(jobs), float(span or 0.0)


def queue_busy(conn: Any, schema: str) -> bool:
    """Whether any job is ready or running. Asked of the ready and running indexes: a count
    over the table would take a CPU away from the drain it is watching."""
    return bool(run(conn, Call("bench_queue_busy", {}, _scalar), schema))


def claim_schema(conn: Any, schema: str) -> None:
    """InvalidInput unless `schema` is free for the benchmark: missing, or left by an earlier
    run (marked, or the default bench schema), since the benchmark drops it when it ends."""
    found = run(conn, Call("bench_schema_mark", {"schema_name": schema}, list), schema)
    if not found or found[0][0] == MARK or schema == BENCH_SCHEMA:
        return
    raise InvalidInput(
        f"schema {schema!r} already exists and jobtui bench did not make it; the benchmark drops its schema"
        " when it ends, so give one that does not exist (default jobtui_bench)"
    )


def mark_schema(conn: Any, schema: str) -> None:
    """Mark `schema` as the benchmark's own (see claim_schema)."""
    run(conn, Call("bench_schema_set_mark", {}, _nothing), schema)


def vacuum(conn: Any, schema: str) -> None:
    """VACUUM ANALYZE the job table, so that the drain starts from fresh statistics."""
    run(conn, Call("bench_vacuum", {}, _nothing), schema)


def latency_left(conn: Any, schema: str, first: int) -> int:
    """How many latency jobs (ids from `first` on) are not done yet."""
    return int(run(conn, Call("bench_latency_left", {"first": first}, _scalar), schema) or 0)


def latencies(conn: Any, schema: str, first: int) -> list[float]:
    """Milliseconds from enqueue to start of each latency job that started."""
    rows = run(conn, Call("bench_latencies", {"first": first}, list), schema)
    return [float(r[0]) for r in rows if r[0] is not None]
