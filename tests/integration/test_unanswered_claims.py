"""A claim whose answer was lost (its connection broke during it: a failover, a restart) took
jobs the worker never saw. The worker gives them back, uncounted, before it claims again."""

from __future__ import annotations

import psycopg

from jobtui import NewJob, Queue
from jobtui.core.queue import release_unanswered_call

Conn = psycopg.Connection[tuple[object, ...]]


def test_jobs_of_a_lost_claim_go_back_to_ready_uncounted_and_no_others(dsn: str, conn: Conn) -> None:
    with Queue(dsn) as queue:
        queue.enqueue_many([NewJob("mail.send", {"n": i}) for i in range(6)])
        held = queue.claim(["mail.send"], worker="w1", limit=2)  # the worker got these
        queue.claim(["mail.send"], worker="w1", limit=2)  # the answer of this one was lost
        others = queue.claim(["mail.send"], worker="w2", limit=2)  # another worker's
        released = queue.run(release_unanswered_call("w1", [j.id for j in held]))
    rows = {
        int(r[0]): (r[1], r[2], r[3])  # type: ignore[call-overload]
        for r in conn.execute("SELECT id, status, attempts, errors -> -1 ->> 'kind' FROM jobtui.job").fetchall()
    }
    assert len(released) == 2 and not released & {j.id for j in held + others}
    for job_id in released:
        assert rows[job_id] == ("ready", 0, "abandoned")
    for job in held + others:
        assert rows[job.id][:2] == ("running", 1)
