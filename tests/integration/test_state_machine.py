"""The job state machine against a real PostgreSQL, driven by hypothesis.

Random sequences of enqueue (with and without keys, duplicates included), claim (two workers,
small limits, long or zero-length leases), heartbeat, complete, fail, fail_permanently,
release, reap, and the operator's requeue, kill-lease and cancel. Writes name leases drawn
from every lease ever handed out, so stale ones (from an earlier claim of the same job) are
tried all the time, above all on jobs that were lost (lease expired and reaped, or killed)
and claimed again: the frozen worker that wakes up. A plain Python model predicts each
call's result; after every step the whole table is compared with it, and the invariants are
checked on the rows themselves.

Time never decides anything here: a lease is either long (300 s) or of zero length (expired
for any later statement), leases expire on demand with an UPDATE, and delays are 0 or an hour.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from jobtui import Client, Failure, JobStatus, Lease, NewJob
from jobtui.core.claims import claim_call
from jobtui.kernel.domain import DEFAULT_MAX_ATTEMPTS

TYPES = ("a", "b")
# The limits worker w1's handlers declare; w2 claims without any (the default applies).
HANDLER_LIMITS = {"a": 2, "b": 3}
LONG_LEASE = 300.0  # does not expire during a run
ZERO_LEASE = 0.0  # locked_until = the claim's now(): expired for every later statement
LATER = 3600.0  # a delay that does not pass during a run
UNKNOWN_ID = 10**12
ERRORS = [
    "boom",
    "'); DROP TABLE jobtui.job; --",
    "KeyError: 'user_42'\nTraceback (most recent call last):\n  ...",
    "%s %(id)s {schema} $1 \\x",
    "Zoë ✓ 🎉",
    "bad \x00 byte",  # NUL is dropped
    "undecodable \udcff name",  # a lone surrogate is written escaped
]
ACTORS = ["op@host", "x'); DELETE FROM jobtui.audit; --"]

Conn = psycopg.Connection[Any]


def stored_error(text: str) -> str:
    """What the row keeps of an error text (short texts: NUL removed, surrogates escaped)."""
    return text.replace("\x00", "").encode("utf-8", "backslashreplace").decode("utf-8")


@dataclass
class ModelJob:
    id: int
    type: str
    key: str | None
    max_attempts: int | None
    status: str = "ready"
    attempts: int = 0
    token: int = 0  # the lease token of the newest claim; every claim adds one
    locked_by: str | None = None
    expired: bool = False  # running, with locked_until in the past
    due: bool = True  # ready with run_at <= now()
    order: int = 0  # the step whose now() set run_at: claims go by (run_at, id)
    kinds: list[str] = field(default_factory=list)  # the error history, by kind
    last_error: str | None = None
    lease_expirations: int = 0

    @property
    def live(self) -> Lease | None:
        return Lease(self.id, self.token) if self.status == "running" else None

    def ready_at(self, step: int, delay: float = 0.0) -> None:
        self.status = "ready"
        self.due = delay == 0
        self.order = step
        self.expired = False


class JobMachine(RuleBasedStateMachine):
    queue: Client
    conn: Conn

    @initialize(seed=st.lists(st.tuples(st.sampled_from(TYPES), st.none() | st.integers(1, 3)), min_size=1, max_size=4))
    def start(self, seed: list[tuple[str, int | None]]) -> None:
        self.conn.execute("TRUNCATE jobtui.job, jobtui.audit, jobtui.lease_expiry RESTART IDENTITY")
        self.jobs: dict[int, ModelJob] = {}
        self.keys: dict[str, int] = {}
        self.step = 0
        self.operator_calls = 0
        for job_type, max_attempts in seed:  # work for the first claims
            self.enqueue(job_type, None, max_attempts, 0.0)

    # -- helpers ---------------------------------------------------------------------------

    def tick(self) -> int:
        self.step += 1
        return self.step

    def has(self, *statuses: str) -> bool:
        return any(j.status in statuses for j in self.jobs.values())

    def all_leases(self) -> list[Lease]:
        return [Lease(j.id, t) for j in self.jobs.values() for t in range(1, j.token + 1)]

    def live_leases(self) -> list[Lease]:
        return [j.live for j in self.jobs.values() if j.live is not None]

    def is_live(self, lease: Lease) -> bool:
        return self.jobs[lease.job_id].live == lease

    def stale_leases(self) -> list[Lease]:
        return [lz for lz in self.all_leases() if not self.is_live(lz)]

    def draw_stale(self, data: st.DataObject) -> Lease:
        """A stale lease; those of jobs running again under a newer lease more often: the case
        fencing exists for (a worker that froze, or was cut off, while its job was re-claimed)."""
        stale = self.stale_leases()
        rerun = [lz for lz in stale if self.jobs[lz.job_id].status == "running"]
        strategy = st.sampled_from(stale)
        if rerun:
            strategy = st.sampled_from(rerun) | strategy
        lease: Lease = data.draw(strategy)
        return lease

    def draw_leases(self, data: st.DataObject) -> list[Lease]:
        """One to three distinct leases: live ones, and stale ones of jobs running again,
        more often than their share."""
        strategy = st.sampled_from(self.all_leases())
        live = self.live_leases()
        if live:
            strategy = st.sampled_from(live) | strategy
        if any(self.jobs[lz.job_id].status == "running" for lz in self.stale_leases()):
            strategy = strategy | st.builds(self.draw_stale, st.data())
        leases: list[Lease] = data.draw(st.lists(strategy, min_size=1, max_size=3, unique=True))
        return leases

    def draw_ids(self, data: st.DataObject, *favoured: str) -> list[int]:
        """One to three distinct ids (maybe an unknown one), jobs in `favoured` states more often."""
        strategy = st.sampled_from([*self.jobs, UNKNOWN_ID])
        preferred = [j.id for j in self.jobs.values() if j.status in favoured]
        if preferred:
            strategy = st.sampled_from(preferred) | strategy
        ids: list[int] = data.draw(st.lists(strategy, min_size=1, max_size=3, unique=True))
        return ids

    def row(self, job_id: int) -> dict[str, Any]:
        found = self.conn.execute("SELECT to_jsonb(j) FROM jobtui.job j WHERE id = %s", (job_id,)).fetchone()
        assert found is not None
        return dict(found[0])

    # -- enqueue ---------------------------------------------------------------------------

    def _added(self, job_id: int, job_type: str, key: str | None, max_attempts: int | None, delay: float) -> None:
        assert job_id not in self.jobs
        job = ModelJob(job_id, job_type, key, max_attempts)
        job.ready_at(self.step, delay)
        self.jobs[job_id] = job
        if key is not None:
            self.keys[key] = job_id

    @rule(
        job_type=st.sampled_from(TYPES),
        key=st.none() | st.sampled_from(["k1", "k2", "'); DROP TABLE jobtui.job; --"]),
        max_attempts=st.none() | st.integers(1, 3),
        delay=st.sampled_from([0.0, 0.0, LATER]),
    )
    def enqueue(self, job_type: str, key: str | None, max_attempts: int | None, delay: float) -> None:
        self.tick()
        job_id = self.queue.enqueue(job_type, {"n": len(self.jobs)}, key=key, max_attempts=max_attempts, delay=delay)
        if key is not None and key in self.keys:
            assert job_id == self.keys[key], "a duplicate key must return the existing job"
            event("enqueue: duplicate key")
            return
        self._added(job_id, job_type, key, max_attempts, delay)

    @rule(batch=st.lists(st.tuples(st.sampled_from(TYPES), st.none() | st.sampled_from(["k1", "k3"])), max_size=3))
    def enqueue_many(self, batch: list[tuple[str, str | None]]) -> None:
        self.tick()
        ids = self.queue.enqueue_many([NewJob(t, key=k, max_attempts=2) for t, k in batch])
        assert len(ids) == len(batch)
        created = []
        for (job_type, key), job_id in zip(batch, ids, strict=True):
            if key is not None and key in self.keys:
                assert job_id == self.keys[key], "a duplicate key must return the existing job"
            else:
                self._added(job_id, job_type, key, 2, 0.0)
                created.append(job_id)
        assert created == sorted(created), "new ids are handed out in input order"

    # -- worker side -----------------------------------------------------------------------

    @rule(
        worker=st.sampled_from(["w1", "w2"]),
        types=st.sampled_from([["a", "b"], ["a", "b"], ["a"], ["b"]]),
        limit=st.integers(1, 3),
        lease=st.sampled_from([LONG_LEASE, LONG_LEASE, ZERO_LEASE]),
    )
    def claim(self, worker: str, types: list[str], limit: int, lease: float) -> None:
        self.tick()
        limits = HANDLER_LIMITS if worker == "w1" else None
        claimed = self.queue.run(claim_call(types, worker=worker, limit=limit, lease=lease, max_attempts=limits))
        candidates = sorted(
            (j for j in self.jobs.values() if j.status == "ready" and j.due and j.type in types),
            key=lambda j: (j.order, j.id),
        )
        expected = candidates[:limit]
        assert sorted(c.id for c in claimed) == sorted(j.id for j in expected), "claim took other jobs"
        event(f"claim: {len(claimed)} of limit {limit}")
        for c in claimed:
            job = self.jobs[c.id]
            job.status = "running"
            job.attempts += 1
            job.token += 1
            if job.max_attempts is None:
                job.max_attempts = (limits or {}).get(job.type, DEFAULT_MAX_ATTEMPTS)
            job.locked_by = worker
            job.expired = lease == ZERO_LEASE
            assert (c.attempt, c.max_attempts, c.lease_token, c.type) == (
                job.attempts,
                job.max_attempts,
                job.token,
                job.type,
            )

    @precondition(lambda self: any(j.token for j in self.jobs.values()))
    @rule(data=st.data(), lease=st.sampled_from([LONG_LEASE, ZERO_LEASE]))
    def heartbeat(self, data: st.DataObject, lease: float) -> None:
        self.tick()
        leases = self.draw_leases(data)
        held = self.queue.heartbeat(leases, lease)
        # An expired lease is lost by the database's clock, even when no reaper took it yet:
        # its worker gives the attempt up rather than extend it.
        assert held == {lz.job_id for lz in leases if self.is_live(lz) and not self.jobs[lz.job_id].expired}
        for job_id in held:
            self.jobs[job_id].expired = lease == ZERO_LEASE
        if any(self.is_live(lz) and self.jobs[lz.job_id].expired for lz in leases):
            event("heartbeat: an expired, unreaped lease refused")
        if len(held) < len(leases):
            event("heartbeat: stale lease refused")

    @precondition(lambda self: any(j.token for j in self.jobs.values()))
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        self.tick()
        leases = self.draw_leases(data)
        done = self.queue.complete(leases)
        assert done == {lz.job_id for lz in leases if self.is_live(lz)}
        for job_id in done:
            job = self.jobs[job_id]
            job.status, job.expired = "done", False

    @precondition(lambda self: any(j.token for j in self.jobs.values()))
    @rule(data=st.data())
    def fail(self, data: st.DataObject) -> None:
        step = self.tick()
        leases = self.draw_leases(data)
        failures = [
            Failure(lz, data.draw(st.sampled_from(ERRORS)), data.draw(st.sampled_from([0.0, LATER]))) for lz in leases
        ]
        outcomes = self.queue.fail(failures)
        assert sorted(o.job_id for o in outcomes) == sorted(f.lease.job_id for f in failures if self.is_live(f.lease))
        by_id = {f.lease.job_id: f for f in failures if self.is_live(f.lease)}
        for outcome in outcomes:
            job = self.jobs[outcome.job_id]
            assert job.max_attempts is not None
            spent = job.attempts >= job.max_attempts
            assert outcome.status == (JobStatus.DEAD if spent else JobStatus.READY)
            assert (outcome.attempt, outcome.max_attempts, outcome.worker) == (
                job.attempts,
                job.max_attempts,
                job.locked_by,
            )
            failure = by_id[job.id]
            event(f"fail: {'dead' if spent else 'retry'}")
            if spent:
                job.status, job.expired = "dead", False
            else:
                job.ready_at(step, failure.delay)
            job.kinds.append("error")
            job.last_error = stored_error(failure.error)

    @precondition(lambda self: any(j.token for j in self.jobs.values()))
    @rule(data=st.data(), error=st.sampled_from(ERRORS))
    def fail_permanently(self, data: st.DataObject, error: str) -> None:
        self.tick()
        leases = self.draw_leases(data)
        failed = self.queue.fail_permanently(leases, [error] * len(leases))
        assert failed == {lz.job_id for lz in leases if self.is_live(lz)}
        for job_id in failed:
            job = self.jobs[job_id]
            job.status, job.expired = "failed", False
            job.kinds.append("permanent")
            job.last_error = stored_error(error)

    @precondition(lambda self: any(j.token for j in self.jobs.values()))
    @rule(data=st.data(), delay=st.sampled_from([0.0, LATER]))
    def release(self, data: st.DataObject, delay: float) -> None:
        step = self.tick()
        leases = self.draw_leases(data)
        released = self.queue.release(leases, [delay] * len(leases))
        assert released == {lz.job_id for lz in leases if self.is_live(lz)}
        for job_id in released:
            job = self.jobs[job_id]
            job.attempts -= 1  # not counted
            job.ready_at(step, delay)
            job.kinds.append("shutdown")  # the history says why, though nothing failed

    @precondition(lambda self: self.has("running"))
    @rule(data=st.data())
    def expire_a_lease(self, data: st.DataObject) -> None:
        self.expire(data.draw(st.sampled_from([j for j in self.jobs.values() if j.status == "running"])))

    def expire(self, job: ModelJob) -> None:
        """The worker holding this lease stopped heartbeating (crashed, froze, lost its network)."""
        self.tick()
        self.conn.execute("UPDATE jobtui.job SET locked_until = now() - interval '1 second' WHERE id = %s", (job.id,))
        job.expired = True

    @precondition(lambda self: self.has("running"))
    @rule(
        data=st.data(),
        how=st.sampled_from(["expired", "killed"]),
        worker=st.sampled_from(["w1", "w2"]),
        lease=st.sampled_from([LONG_LEASE, ZERO_LEASE]),
    )
    def lose_a_lease_and_claim_again(self, data: st.DataObject, how: str, worker: str, lease: float) -> None:
        """A lease lost while its worker still runs the job, and another claim: the old
        worker's lease is now stale while the job is running (what fencing is for)."""
        job = data.draw(st.sampled_from([j for j in self.jobs.values() if j.status == "running"]))
        if how == "expired":
            self.expire(job)
            self.reap()
        else:
            self.kill([job.id], "op@host")
        self.claim(worker, [job.type], 3, lease)

    @precondition(lambda self: self.has("running"))
    @rule()
    def reap(self) -> None:
        step = self.tick()
        reaped = self.queue.reap()
        expired = [j for j in self.jobs.values() if j.status == "running" and j.expired]
        assert sorted(r.job_id for r in reaped) == sorted(j.id for j in expired)
        for r in reaped:
            job = self.jobs[r.job_id]
            assert job.max_attempts is not None
            spent = job.attempts >= job.max_attempts
            assert (r.status, r.attempt, r.worker, r.type) == (
                JobStatus.DEAD if spent else JobStatus.READY,
                job.attempts,
                job.locked_by,
                job.type,
            )
            event(f"reap: {'dead' if spent else 'ready'}")
            if spent:
                job.status, job.expired = "dead", False
            else:
                job.ready_at(step)
            job.lease_expirations += 1
            job.kinds.append("lease_expired")
            suffix = " (attempts exhausted: the job may be crashing its worker)" if spent else ""
            job.last_error = (
                f"lease expired: worker {job.locked_by} stopped heartbeating during attempt "
                f"{job.attempts} of {job.max_attempts}{suffix}"
            )

    # -- a stale lease, on its own ---------------------------------------------------------

    @precondition(lambda self: any(not self.is_live(lz) for lz in self.all_leases()))
    @rule(data=st.data())
    def write_with_a_stale_lease(self, data: st.DataObject) -> None:
        """Every write naming a lease that is not the job's current one returns nothing and
        changes nothing, not even the heartbeat time."""
        self.tick()
        stale = self.draw_stale(data)
        event(f"stale lease write on a {self.jobs[stale.job_id].status} job")
        before = self.row(stale.job_id)
        assert self.queue.heartbeat([stale], 3000) == set()
        assert self.queue.complete([stale]) == set()
        assert self.queue.fail([Failure(stale, "late", 0)]) == []
        assert self.queue.fail_permanently([stale], ["late"]) == set()
        assert self.queue.release([stale]) == set()
        assert self.row(stale.job_id) == before

    # -- operator side ---------------------------------------------------------------------

    @precondition(lambda self: self.has("dead", "failed"))
    @rule(data=st.data(), actor=st.sampled_from(ACTORS))
    def requeue(self, data: st.DataObject, actor: str) -> None:
        step = self.tick()
        ids = self.draw_ids(data, "dead", "failed")
        moved = self.queue.requeue(ids, actor=actor)
        self.operator_calls += 1
        assert sorted(moved) == sorted(i for i in ids if i in self.jobs and self.jobs[i].status in ("dead", "failed"))
        for job_id in moved:
            job = self.jobs[job_id]
            job.ready_at(step)
            job.attempts = 0
            job.kinds.append("requeued")

    @precondition(lambda self: self.has("running"))
    @rule(data=st.data(), actor=st.sampled_from(ACTORS))
    def kill_lease(self, data: st.DataObject, actor: str) -> None:
        self.kill(self.draw_ids(data, "running"), actor)

    def kill(self, ids: list[int], actor: str) -> None:
        step = self.tick()
        killed = self.queue.kill_lease(ids, actor=actor)
        self.operator_calls += 1
        assert sorted(killed) == sorted(i for i in ids if i in self.jobs and self.jobs[i].status == "running")
        for job_id in killed:
            job = self.jobs[job_id]
            assert job.max_attempts is not None
            # A killed attempt counts: the last one goes dead.
            spent = job.attempts >= job.max_attempts
            event(f"kill-lease: {'dead' if spent else 'ready'}")
            if spent:
                job.status, job.expired = "dead", False
            else:
                job.ready_at(step)
            job.kinds.append("lease_killed")
            suffix = " (its last attempt: dead)" if spent else ""
            job.last_error = f"lease killed by {actor} during attempt {job.attempts} of {job.max_attempts}{suffix}"

    @precondition(lambda self: self.has("ready", "running"))
    @rule(data=st.data(), actor=st.sampled_from(ACTORS))
    def cancel(self, data: st.DataObject, actor: str) -> None:
        self.tick()
        ids = self.draw_ids(data, "ready", "running")
        cancelled = self.queue.cancel(ids, actor=actor)
        self.operator_calls += 1
        assert sorted(cancelled) == sorted(
            i for i in ids if i in self.jobs and self.jobs[i].status in ("ready", "running")
        )
        for job_id in cancelled:
            job = self.jobs[job_id]
            job.status, job.expired = "failed", False
            job.kinds.append("cancelled")
            job.last_error = f"cancelled by {actor}"

    @precondition(lambda self: any(j.status == "ready" and not j.due for j in self.jobs.values()))
    @rule(data=st.data())
    def time_passes_for_a_delayed_job(self, data: st.DataObject) -> None:
        step = self.tick()
        job = data.draw(st.sampled_from([j for j in self.jobs.values() if j.status == "ready" and not j.due]))
        self.conn.execute("UPDATE jobtui.job SET run_at = now() WHERE id = %s", (job.id,))
        job.ready_at(step)

    # -- after every step: the table is the model ------------------------------------------

    @invariant()
    def the_table_matches_the_model(self) -> None:
        rows = self.conn.execute(
            """
            SELECT id, type, idempotency_key, status, attempts, max_attempts, lease_token, locked_by,
                   locked_until IS NOT NULL, locked_until < now(), run_at <= now(),
                   jsonb_path_query_array(errors, '$[*].kind'), last_error, lease_expirations,
                   finished_at IS NOT NULL
            FROM jobtui.job ORDER BY id
            """
        ).fetchall()
        assert [r[0] for r in rows] == sorted(self.jobs), "rows appeared or vanished"
        for (
            job_id,
            job_type,
            key,
            status,
            attempts,
            max_attempts,
            token,
            locked_by,
            locked,
            expired,
            due,
            kinds,
            last_error,
            expirations,
            finished,
        ) in rows:
            job = self.jobs[job_id]
            assert (job_type, key, status) == (job.type, job.key, job.status), job_id
            assert (attempts, max_attempts, token) == (job.attempts, job.max_attempts, job.token), job_id
            assert (locked_by, last_error, expirations) == (job.locked_by, job.last_error, job.lease_expirations)
            # The error history grows by one entry per failure, expiry and operator action.
            assert kinds == job.kinds[-50:], job_id
            # A lease exists exactly while running, and it is the newest claim's: each claim
            # handed out one token, so no two leases on a job can both be current.
            assert locked == (status == "running"), job_id
            if status == "running":
                assert expired == job.expired, job_id
            if status == "ready":
                assert due == job.due, job_id
            assert finished == (status in ("done", "failed", "dead")), job_id
            assert 0 <= attempts <= token
            # Attempts stay within the limit, killed leases included.
            if max_attempts is not None:
                assert attempts <= max_attempts, job_id
            else:
                assert token == 0 and attempts == 0
        expiries = self.conn.execute("SELECT count(*) FROM jobtui.lease_expiry").fetchone()
        assert expiries == (sum(j.lease_expirations for j in self.jobs.values()),)
        audits = self.conn.execute("SELECT count(*) FROM jobtui.audit").fetchone()
        assert audits == (self.operator_calls,)


def test_job_state_machine(dsn: str, conn: Conn) -> None:
    with Client(dsn) as queue:
        JobMachine.queue = queue
        JobMachine.conn = conn
        run_state_machine_as_test(
            JobMachine,
            settings=settings(
                max_examples=100,
                stateful_step_count=40,
                deadline=None,
                database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            ),
        )
    # The tables are all still there after every hostile text above went through them.
    tables = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'jobtui'").fetchone()
    assert tables is not None and tables[0] >= 8
