"""The queue's operations: enqueue, claim, heartbeat, complete, fail, release, reap, read a
job, and the handlers' effect records.

Each operation is built once as a `Call` (statement name, parameters, decoder) and run by a
client (client.py), or by a worker on its own connection.

    with connect(dsn) as conn:
        job_id = enqueue(conn, enqueue_call("email.send", {"user_id": 42}, key="welcome:42"))
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from operator import itemgetter
from typing import Any, TypedDict, Unpack

import psycopg
from psycopg.rows import TupleRow
from psycopg.types.numeric import Int4, Int8

from jobtui.kernel.checks import (
    check_delay,
    check_key,
    check_lease,
    check_max_attempts,
    check_queue,
    check_run_at,
    check_text,
    check_type,
    clip_error,
    encode_payload,
)
from jobtui.kernel.db import Call, Rows, arun, first_int, int_set, run, statements
from jobtui.kernel.domain import (
    DEFAULT_LEASE_SECONDS,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_QUEUE,
    DEFAULT_SCHEMA,
    ClaimedJob,
    ErrorEntry,
    FailOutcome,
    Failure,
    JobRow,
    JobStatus,
    Lease,
    NewJob,
    Reaped,
    Runner,
)
from jobtui.kernel.errors import InvalidInput

COPY_THRESHOLD = 1000
_JSON_DECODER = json.JSONDecoder()


# -- calls --------------------------------------------------------------------------------


def _bigints(values: Iterable[int]) -> str:
    """A bigint[] literal, for a parameter the statement casts (`%(ids)s::bigint[]`)."""
    return "{" + ",".join(map(str, map(int, values))) + "}"


def _leases(leases: Sequence[Lease]) -> dict[str, Any]:
    # The ids and tokens go as array literals joined here, typed once by the statement's cast:
    # a list would be adapted element by element (Python code per id, several times this),
    # and a list of small ints would go as int[], cast again for every row the statement reads.
    return {"ids": _bigints([lease.job_id for lease in leases]), "tokens": _bigints([lease.token for lease in leases])}


def _lease_map(leases: Sequence[Lease]) -> dict[str, Any]:
    """The ids as a bigint[] literal and `leases`, a JSON object of id -> token: the params
    of the statements that look each row's token up (complete, complete_deleting, heartbeat).
    One lease per job (`_newest_leases`): a JSON object keeps the last of a repeated key."""
    tokens = ",".join([f'"{int(lease.job_id)}":{int(lease.token)}' for lease in leases])
    return {"ids": _bigints([lease.job_id for lease in leases]), "leases": "{" + tokens + "}"}


class EnqueueOptions(TypedDict, total=False):
    """The options of one enqueue: the keyword arguments of `enqueue_call`, `Queue.enqueue` and
    `AsyncQueue.enqueue`. Left out: no idempotency key, no delay, run at once, the handler's
    max_attempts, and the handler's declared queue (`Queue(jobs=...)`), else DEFAULT_QUEUE."""

    key: str | None
    delay: float  # seconds from now
    run_at: Any  # a datetime, instead of a delay
    max_attempts: int | None
    queue: str | None


ENQUEUE_OPTIONS = frozenset(EnqueueOptions.__annotations__)


def enqueue_call(
    job_type: str, payload: Any = None, *, meta: Mapping[str, Any] | None = None, **options: Unpack[EnqueueOptions]
) -> Call[int | None]:
    unknown = options.keys() - ENQUEUE_OPTIONS
    if unknown:
        raise TypeError(f"enqueue got an unexpected keyword argument {min(unknown)!r}")
    queue = options.get("queue")
    params = {
        "queue": check_queue(DEFAULT_QUEUE if queue is None else queue),
        "type": check_type(job_type),
        "payload": encode_payload(payload),
        "key": check_key(options.get("key")),
        "delay": check_delay(options.get("delay", 0.0)),
        "run_at": check_run_at(options.get("run_at")),
        "max_attempts": check_max_attempts(options.get("max_attempts")),
        "meta": _meta(meta),
    }
    # A key is claimed in job_key, where it outlives its job (see the statement); a job without
    # one costs no more than it did before keys were kept.
    return Call("enqueue" if params["key"] is None else "enqueue_keyed", params, first_int)


def _meta(meta: Mapping[str, Any] | None) -> str | None:
    """A job's metadata (trace context and the like) as JSON text, or None for none."""
    return None if not meta else encode_payload(dict(meta))


def enqueue_many_params(jobs: Sequence[NewJob]) -> dict[str, Any]:
    return {
        "types": [check_type(j.type) for j in jobs],
        "payloads": [encode_payload(j.payload) for j in jobs],
        "keys": [check_key(j.key) for j in jobs],
        "delays": [check_delay(j.delay) for j in jobs],
        "max_attempts": [check_max_attempts(j.max_attempts) for j in jobs],
        "metas": [_meta(j.meta) for j in jobs],
        "queues": [check_queue(DEFAULT_QUEUE if j.queue is None else j.queue) for j in jobs],
    }


_CLAIMED = ("id", "type", "payload", "attempts", "max_attempts", "lease_token", "locked_until", "created_at")


def _claimed(rows: Rows) -> list[ClaimedJob]:
    """The claimed jobs in the order they were waiting: run_at, then id."""
    i, t, p, a, m, k, u, c = rows.columns(*_CLAIMED)
    r_at, n, meta, q = rows.columns("run_at", "uncounted", "meta", "queue")
    # jsonb's text has no white space around the value: raw_decode skips decode's two scans for it.
    decode = _JSON_DECODER.raw_decode
    return [
        ClaimedJob(
            id=r[i],
            type=r[t],
            payload=decode(r[p])[0],
            attempt=r[a],
            max_attempts=r[m],
            lease_token=r[k],
            locked_until=r[u],
            created_at=r[c],
            run_at=r[r_at],
            uncounted=r[n],
            meta=None if r[meta] is None else decode(r[meta])[0],
            queue=r[q],
        )
        for r in sorted(rows, key=itemgetter(r_at, i))
    ]


def claim_call(
    types: Sequence[str],
    *,
    worker: str,
    limit: int,
    lease: float = DEFAULT_LEASE_SECONDS,
    max_attempts: Mapping[str, int] | None = None,
    queue: str | None = None,
) -> Call[list[ClaimedJob]]:
    """Claim up to `limit` jobs of `types` from `queue` (None: from any queue); jobs enqueued
    without a limit of attempts take theirs from `max_attempts` (by type, usually the
    handlers'), else DEFAULT_MAX_ATTEMPTS. Paused queues and types, and queues at their
    limit, give none (see the statement)."""
    if limit < 1:
        raise InvalidInput(f"claim limit must be at least 1, got {limit}")
    limits = max_attempts or {}
    params = {
        "types": [check_text(t, "job type") for t in types],
        # int[] as the statement expects it (see _leases)
        "max_attempts": [None if limits.get(t) is None else Int4(limits[t]) for t in types],
        "default_max_attempts": DEFAULT_MAX_ATTEMPTS,
        "worker": check_text(worker, "worker id"),
        "limit": limit,
        "lease": check_lease(lease),
        "queue": None if queue is None else check_queue(queue),
    }
    return Call("claim", params, _claimed, binary=True)


def claim_builtin_call(
    types: Sequence[str],
    *,
    worker: str,
    limit: int,
    lease: float = DEFAULT_LEASE_SECONDS,
    max_attempts: Mapping[str, int] | None = None,
) -> Call[list[ClaimedJob]]:
    """Claim up to `limit` of jobtui's own jobs of `types` from their queue, through its own
    index: a worker's slot for them claims once a poll whatever the backlog of other queues."""
    params = claim_call(types, worker=worker, limit=limit, lease=lease, max_attempts=max_attempts).params
    del params["queue"]
    return Call("claim_builtin", params, _claimed, binary=True)


def _newest_leases(leases: Sequence[Lease]) -> list[Lease]:
    """One lease per job, the one with the highest token: complete and heartbeat look each
    job's token up by its id, and a job's current token is never lower than any token handed
    out for it, so an older lease of the same job in the batch can only be stale."""
    if len({lease.job_id for lease in leases}) == len(leases):
        return list(leases)  # no job twice: the common case, checked at C speed
    newest: dict[int, Lease] = {}
    for lease in leases:
        held = newest.get(lease.job_id)
        if held is None or lease.token > held.token:
            newest[lease.job_id] = lease
    return list(newest.values()) if len(newest) < len(leases) else list(leases)


@dataclass(frozen=True, slots=True)
class Beat:
    """A heartbeat's answer: the jobs whose leases were extended, and those of the lost
    ones that an operator cancelled."""

    held: set[int]
    cancelled: set[int]


def _beat(rows: Rows) -> Beat:
    i, k = rows.columns("id", "lease")
    return Beat({r[i] for r in rows if r[k] == "held"}, {r[i] for r in rows if r[k] == "cancelled"})


def heartbeat_beat_call(
    leases: Sequence[Lease],
    lease: float = DEFAULT_LEASE_SECONDS,
    *,
    keep: Sequence[int] = (),
    runners: Mapping[int, Mapping[str, Any]] | None = None,
) -> Call[Beat]:
    """Extend `leases` (those of the jobs in `keep` even once expired, while the token is
    theirs), recording `runners`, what runs each job (job.runner); the answer also names the
    lost leases whose jobs were cancelled."""
    newest = _newest_leases(leases)
    found = runners or {}
    params = {
        **_lease_map(newest),
        "lease": check_lease(lease),
        "keep": _bigints(keep),
        "runners": json.dumps({str(lc.job_id): found[lc.job_id] for lc in newest if lc.job_id in found}),
    }
    return Call("heartbeat", params, _beat)


def heartbeat_call(leases: Sequence[Lease], lease: float = DEFAULT_LEASE_SECONDS) -> Call[set[int]]:
    """Extend `leases`; the ids whose leases still hold."""
    beat = heartbeat_beat_call(leases, lease)
    return Call(beat.name, beat.params, lambda rows: _beat(rows).held)


def complete_call(leases: Sequence[Lease]) -> Call[set[int]]:
    return Call("complete", _lease_map(_newest_leases(leases)), int_set)


def complete_deleting_call(leases: Sequence[Lease]) -> Call[set[int]]:
    """Complete jobs without a key by deleting them (counted in done_tally); the ids of keyed
    jobs and of lost leases are missing from the result: pass those to complete_call."""
    return Call("complete_deleting", _lease_map(_newest_leases(leases)), int_set)


def _fail_outcomes(rows: Rows) -> list[FailOutcome]:
    return [
        FailOutcome(
            d["id"], JobStatus(d["status"]), d["type"], d["attempts"], d["max_attempts"], d["locked_by"], d["queue"]
        )
        for d in rows.dicts()
    ]


def fail_call(failures: Sequence[Failure]) -> Call[list[FailOutcome]]:
    params = {
        **_leases([f.lease for f in failures]),
        "delays": [check_delay(f.delay) for f in failures],
        "errors": [clip_error(f.error) for f in failures],
    }
    return Call("fail", params, _fail_outcomes)


def fail_permanently_call(leases: Sequence[Lease], errors: Sequence[str]) -> Call[set[int]]:
    params = {**_leases(leases), "errors": [clip_error(e) for e in errors]}
    return Call("fail_permanently", params, int_set)


RELEASE_KINDS = ("retry", "db_error", "abandoned", "shutdown")


def release_call(
    leases: Sequence[Lease],
    delays: Sequence[float] | None = None,
    *,
    kinds: Sequence[str] | None = None,
    reasons: Sequence[str] | None = None,
) -> Call[set[int]]:
    """Return jobs to ready without counting their attempt; `kinds` (RELEASE_KINDS, default
    "shutdown") and `reasons` go into each job's history (see the statement)."""
    count = len(leases)
    kinds = list(kinds or ["shutdown"] * count)
    unknown = sorted(set(kinds) - set(RELEASE_KINDS))
    if unknown:
        raise InvalidInput(f"unknown release kind(s) {', '.join(unknown)}: use {', '.join(RELEASE_KINDS)}")
    params = {
        **_leases(leases),
        "delays": [check_delay(d) for d in (delays or [0.0] * count)],
        "kinds": kinds,
        "reasons": [clip_error(r) for r in (reasons or ["released"] * count)],
    }
    return Call("release", params, int_set)


def release_unanswered_call(worker: str, held: Sequence[int]) -> Call[set[int]]:
    """Return to ready, uncounted, the jobs running under `worker`'s name but not in `held`:
    what a claim whose answer was lost took (see the statement)."""
    return Call("release_unanswered", {"worker": worker, "held": list(held)}, int_set)


def _reaped(rows: Rows) -> list[Reaped]:
    # The first row is the round itself (see the statement), not a job.
    return [
        Reaped(d["job_id"], d["type"], d["worker"], d["attempt"], JobStatus(d["status"]), d["at"], d["queue"])
        for d in rows.dicts()
        if d["job_id"] is not None
    ]


def _reap_params(limit: int, own: Sequence[int]) -> dict[str, Any]:
    if limit < 1:
        raise InvalidInput(f"reap limit must be at least 1, got {limit}")
    return {"limit": limit, "own": [Int8(i) for i in own], "previous": None, "continuity": None}


def reap_call(limit: int = 1000, own: Sequence[int] = ()) -> Call[list[Reaped]]:
    """Take back up to `limit` expired leases, except those of jobs `own` (the reaping
    worker's: it runs them, or is giving them up itself)."""
    return Call("reap", _reap_params(limit, own), _reaped)


@dataclass(frozen=True, slots=True)
class ReapRound:
    """One round of a worker's reaper: when it ran (the database's now()), whether it was
    in touch often enough to reap (see the statement), and what it took back."""

    at: datetime
    open: bool
    reaped: list[Reaped]


def _reap_round(rows: Rows) -> ReapRound:
    marker = next(d for d in rows.dicts() if d["job_id"] is None)
    return ReapRound(marker["at"], marker["status"] == "open", _reaped(rows))


def reap_round_call(
    previous: datetime | None, continuity: float, limit: int = 1000, own: Sequence[int] = ()
) -> Call[ReapRound]:
    """A worker reaper's round: reaps only when its `previous` round ran less than
    `continuity` seconds before this one, by the database's clock."""
    params = {**_reap_params(limit, own), "previous": previous, "continuity": float(continuity)}
    return Call("reap", params, _reap_round)


def _job_row(rows: Rows) -> JobRow | None:
    if not rows:
        return None
    row = rows.dicts()[0]
    errors = [
        ErrorEntry(
            at=str(e.get("at", "")),
            attempt=int(e.get("attempt") or 0),
            worker=e.get("worker"),
            kind=str(e.get("kind", "error")),
            error=str(e.get("error", "")),
            started=None if e.get("started") is None else str(e["started"]),
        )
        for e in (row.pop("errors") or [])
    ]
    return JobRow(
        **{**row, "status": JobStatus(row["status"]), "runner": Runner.decoded(row.get("runner"))}, errors=errors
    )


def get_job_call(job_id: int) -> Call[JobRow | None]:
    return Call("get_job", {"id": job_id}, _job_row)


def job_statuses_call(ids: Sequence[int]) -> Call[dict[int, JobStatus]]:
    return Call(
        "job_statuses", {"ids": list(ids)}, lambda rows: {d["id"]: JobStatus(d["status"]) for d in rows.dicts()}
    )


# -- running calls ------------------------------------------------------------------------


def _copy_rows(ids: Sequence[int], params: dict[str, Any]) -> Iterable[tuple[Any, ...]]:
    return zip(
        ids, params["types"], params["payloads"], params["max_attempts"], params["metas"], params["queues"], strict=True
    )


def _can_copy(jobs: Sequence[NewJob]) -> bool:
    # COPY cannot skip duplicate keys or add a delay to the database's clock.
    return len(jobs) >= COPY_THRESHOLD and all(j.key is None and j.delay == 0 for j in jobs)


def _many_statement(jobs: Sequence[NewJob]) -> str:
    return "enqueue_many" if all(j.key is None for j in jobs) else "enqueue_many_keyed"


def _missing(jobs: Sequence[NewJob], found: list[TupleRow]) -> list[str]:
    """The keys of `jobs` that no row of `found` (id, key) holds."""
    return list({j.key for j in jobs if j.key is not None} - {k for _, k in found})


def _gone(jobs: Sequence[NewJob], found: list[TupleRow]) -> list[NewJob]:
    """The jobs of `jobs` whose keys no row of `found` holds: keys forgotten by the archiver
    between an enqueue's two statements, which make new jobs."""
    missing = set(_missing(jobs, found))
    return [j for j in jobs if j.key in missing]


def _merge_existing(jobs: Sequence[NewJob], inserted: list[TupleRow], existing: list[TupleRow]) -> list[int]:
    """Ids in input order: new rows by position, duplicates by their existing key."""
    by_key = {key: int(i) for i, key in existing}
    by_key.update({key: int(i) for i, key in inserted if key is not None})
    new_ids = iter(int(i) for i, key in inserted if key is None)
    result = []
    for job in jobs:
        result.append(by_key[job.key] if job.key is not None else next(new_ids))
    return result


def enqueue_many(conn: psycopg.Connection[Any], jobs: Sequence[NewJob], schema: str = DEFAULT_SCHEMA) -> list[int]:
    """Insert `jobs` on `conn` (in its transaction); return their ids in input order.

    A job whose key is held (by a job in the queue table, or one that left it within the
    key's window) is not inserted; that job's id is returned.
    """
    if not jobs:
        return []
    params = enqueue_many_params(jobs)
    stmts = statements(schema)
    with conn.cursor() as cur:
        if _can_copy(jobs):
            cur.execute(stmts["reserve_ids"], {"table": f'"{schema}".job', "n": len(jobs)})
            ids = [int(r[0]) for r in cur.fetchall()]
            with cur.copy(stmts["copy_jobs"]) as copy:
                for row in _copy_rows(ids, params):
                    copy.write_row(row)
            return ids
        cur.execute(stmts[_many_statement(jobs)], params)
        inserted = cur.fetchall()
        existing: list[TupleRow] = []
        missing = _missing(jobs, inserted)
        if missing:
            cur.execute(stmts["enqueue_existing_many"], {"keys": missing})
            existing = cur.fetchall()
    gone = _gone(jobs, inserted + existing)
    if gone:
        # Keys forgotten (their window passed) between the two statements: those jobs again.
        existing += list(zip(enqueue_many(conn, gone, schema), [j.key for j in gone], strict=True))
    return _merge_existing(jobs, inserted, existing)


async def aenqueue_many(
    conn: psycopg.AsyncConnection[Any], jobs: Sequence[NewJob], schema: str = DEFAULT_SCHEMA
) -> list[int]:
    """Async counterpart of `enqueue_many`."""
    if not jobs:
        return []
    params = enqueue_many_params(jobs)
    stmts = statements(schema)
    async with conn.cursor() as cur:
        if _can_copy(jobs):
            await cur.execute(stmts["reserve_ids"], {"table": f'"{schema}".job', "n": len(jobs)})
            ids = [int(r[0]) for r in await cur.fetchall()]
            async with cur.copy(stmts["copy_jobs"]) as copy:
                for row in _copy_rows(ids, params):
                    await copy.write_row(row)
            return ids
        await cur.execute(stmts[_many_statement(jobs)], params)
        inserted = await cur.fetchall()
        existing: list[TupleRow] = []
        missing = _missing(jobs, inserted)
        if missing:
            await cur.execute(stmts["enqueue_existing_many"], {"keys": missing})
            existing = await cur.fetchall()
    gone = _gone(jobs, inserted + existing)
    if gone:
        existing += list(zip(await aenqueue_many(conn, gone, schema), [j.key for j in gone], strict=True))
    return _merge_existing(jobs, inserted, existing)


def enqueue(conn: psycopg.Connection[Any], call: Call[int | None], schema: str = DEFAULT_SCHEMA) -> int:
    """Run an enqueue call; with a key that is held already, the id of the job holding it."""
    job_id = run(conn, call, schema)
    if job_id is None:
        job_id = run(conn, Call("enqueue_existing", {"key": call.params["key"]}, first_int), schema)
    if job_id is None:
        # The key's window passed and the archiver forgot it between the two statements.
        return enqueue(conn, call, schema)
    return job_id


async def aenqueue(conn: psycopg.AsyncConnection[Any], call: Call[int | None], schema: str = DEFAULT_SCHEMA) -> int:
    """Async counterpart of `enqueue`."""
    job_id = await arun(conn, call, schema)
    if job_id is None:
        job_id = await arun(conn, Call("enqueue_existing", {"key": call.params["key"]}, first_int), schema)
    if job_id is None:
        return await aenqueue(conn, call, schema)
    return job_id


# -- effects (the handlers' idempotency helper) --------------------------------------------


def record_effect_call(key: str, job_id: int | None, token: int | None = None) -> Call[tuple[bool, bool]]:
    """Record effect `key` as done: (lease held, recorded by this call). With a lease `token`,
    nothing is recorded unless job `job_id` still runs under that lease."""
    if not key or "\x00" in key:
        raise InvalidInput("an effect key must be a non-empty string without NUL")
    params = {"key": key, "job_id": job_id, "token": token}
    return Call("effect_record", params, lambda rows: (bool(rows[0][0]), bool(rows[0][1])))


def effect_exists_call(key: str) -> Call[bool]:
    return Call("effect_exists", {"key": key}, lambda rows: bool(rows and rows[0][0]))
