"""Lookups by id after a burst, while the table's statistics are from before it (autovacuum
analyzes later, or not at all while it is busy): the planner then takes a status's partial
index for a few rows. A status fence written plainly let it read that whole index, filtering
by id, on every claim, drill-down and action. Each statement here runs under EXPLAIN
(ANALYZE, BUFFERS), as the worker or the console sends it, and must touch a bounded number of
pages however big the burst.
"""

from __future__ import annotations

from typing import Any

import psycopg

from jobtui.core.actions import requeue_call
from jobtui.core.claims import claim_builtin_call, claim_call, heartbeat_call
from jobtui.core.maintenance import ARCHIVE_TYPE
from jobtui.kernel.db import Call, statements
from jobtui.kernel.domain import Lease
from jobtui.reads.backlog import READY_EXACT_CAP

Conn = psycopg.Connection[Any]
BURST = 100_000
# As the timer guard's bound (tests/integration/test_timer_guard.py): the statements below
# find at most a claim's or a page's rows by id, and the drill-down reads the first
# READY_EXACT_CAP entries of the ready index. A scan of a status's whole index, filtering by
# id, visits each of the burst's rows: over BURST pages.
PAGE_BOUND = 2_000
# What a worker's claiming connection sets (claim_session): the plans that sort every ready
# row are off there.
CLAIM_SESSION = ("enable_bitmapscan = off", "enable_seqscan = off", "jit = off")


def pages(conn: Conn, call: Call[Any], settings: tuple[str, ...] = ()) -> int:
    """The pages `call` touches, from EXPLAIN (ANALYZE, BUFFERS) of its whole plan, rolled back."""
    with conn.transaction(force_rollback=True):
        for setting in settings:
            conn.execute(f"SET LOCAL {setting}")
        text = statements()[call.name].as_string(conn)
        row = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + text, call.params).fetchone()
    assert row is not None
    plan = row[0][0]["Plan"]
    kinds = [f"{kind} {what} Blocks" for kind in ("Shared", "Local", "Temp") for what in ("Hit", "Read")]
    return sum(int(plan.get(kind, 0)) for kind in kinds)


def ids(conn: Conn, query: str) -> list[int]:
    return [int(r[0]) for r in conn.execute(query).fetchall()]


def test_lookups_by_id_after_a_burst_read_a_bounded_number_of_pages(conn: Conn) -> None:
    # Before the burst: a quiet queue, every job of it done, analyzed.
    conn.execute("""INSERT INTO jobtui.job (type, status, run_at, attempts, finished_at)
                    SELECT 't' || (i %% 5), 'done', now() - interval '1 hour', 1, now() - interval '1 hour'
                    FROM generate_series(1, %s) AS i""", (BURST,))  # fmt: skip
    conn.execute("VACUUM ANALYZE jobtui.job")  # as autovacuum leaves it, which then leaves it alone
    conn.execute("ALTER TABLE jobtui.job SET (autovacuum_enabled = false)")
    # The burst: ready jobs whose run_at is unrelated to their place in the table, dead ones.
    conn.execute(f"""INSERT INTO jobtui.job (type, status, run_at, attempts)
                     SELECT 't' || (i % 5), 'ready', now() - ((i * 7919) % {BURST}) * interval '1 second', 0
                     FROM generate_series(1, {BURST}) AS i""")
    conn.execute(f"""INSERT INTO jobtui.job (type, status, run_at, attempts, finished_at, last_error)
                     SELECT 't' || (i % 5), CASE WHEN i = 1 THEN 'failed' ELSE 'dead' END, now() - interval '1 hour',
                            3, now(), 'boom'
                     FROM generate_series(1, {BURST // 2}) AS i""")
    conn.execute("""INSERT INTO jobtui.job (type, queue, status, run_at, attempts)
                    VALUES (%s, 'jobtui.builtin', 'ready', now(), 0)""", (ARCHIVE_TYPE,))  # fmt: skip
    dead = ids(conn, "SELECT id FROM jobtui.job WHERE status IN ('dead', 'failed') ORDER BY status DESC, id LIMIT 20")
    touched = {
        "claim_take": pages(conn, claim_call(["t1"], worker="w", limit=50, lease=30.0), CLAIM_SESSION),
        "claim_take_builtin": pages(conn, claim_builtin_call([ARCHIVE_TYPE], worker="w", limit=1), CLAIM_SESSION),
        "joblist_ready": pages(conn, Call("joblist_ready", {"type": "t3", "limit": 100, "scan": READY_EXACT_CAP}, len)),
        "action_requeue_by_id": pages(conn, requeue_call(dead, "ops")),
        # A beat whose lease was cancelled reads that job back as failed (dead's index).
        "claim_heartbeat": pages(conn, heartbeat_call([Lease(dead[0], 1)])),
    }
    over = {name: n for name, n in touched.items() if n > PAGE_BOUND}
    assert not over, f"pages touched past {PAGE_BOUND}: {over} (all: {touched})"
