"""Claims and what follows them: a worker takes ready jobs under a lease (claim), keeps the
lease (heartbeat), and ends the attempt (complete, fail, release), or the reaper ends it for a
worker that went silent (reap); and the settings and wake-ups of a worker's claiming
connection. The one module that names the statements of sql/claims.sql.

Each operation is built once as a `Call` (statement name, parameters, decoder) and run by a
worker on its own connection, or by a client.

    with connect(dsn) as conn:
        jobs = run(conn, claim_call(["email.send"], worker="w1", limit=10))
        run(conn, complete_call([Lease(j.id, j.lease_token) for j in jobs]))
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from operator import itemgetter
from typing import Any

import psycopg
from psycopg.types.numeric import Int4, Int8

from jobtui.kernel.checks import (
    check_delay,
    check_lease,
    check_queue,
    check_text,
    clip_error,
)
from jobtui.kernel.db import Call, Rows, int_set, statements
from jobtui.kernel.domain import (
    DEFAULT_LEASE_SECONDS,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_SCHEMA,
    ClaimedJob,
    FailOutcome,
    Failure,
    JobStatus,
    Lease,
    Reaped,
)
from jobtui.kernel.errors import InvalidInput

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
    # %d formats a Lease (a tuple of two ints) in one step: half the cost of an f-string's
    # two fields with their :d checks, once per job. It refuses what is not a number, a
    # string of digits included (int() took those).
    ids = ",".join(["%d" % lease.job_id for lease in leases])  # noqa: UP031
    tokens = ",".join(['"%d":%d' % lease for lease in leases])  # noqa: UP031
    return {"ids": "{" + ids + "}", "leases": "{" + tokens + "}"}


_CLAIMED = ("id", "type", "payload", "attempts", "max_attempts", "lease_token", "locked_until", "created_at")


def _claimed(rows: Rows) -> list[ClaimedJob]:
    """The claimed jobs in the order they were waiting: run_at, then id."""
    i, t, p, a, m, k, u, c = rows.columns(*_CLAIMED)
    r_at, n, meta, q = rows.columns("run_at", "uncounted", "meta", "queue")
    # jsonb's text has no white space around the value: raw_decode skips decode's two scans for it.
    decode = _JSON_DECODER.raw_decode
    # Positional: a dataclass's __init__ takes keywords at about half again the cost.
    return [
        ClaimedJob(
            r[i],
            r[t],
            decode(r[p])[0],
            r[a],
            r[m],
            r[k],
            r[u],
            r[c],
            r[r_at],
            r[n],
            None if r[meta] is None else decode(r[meta])[0],
            r[q],
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
    return Call("claim_take", params, _claimed, binary=True)


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
    return Call("claim_take_builtin", params, _claimed, binary=True)


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
    return Call("claim_heartbeat", params, _beat)


def heartbeat_call(leases: Sequence[Lease], lease: float = DEFAULT_LEASE_SECONDS) -> Call[set[int]]:
    """Extend `leases`; the ids whose leases still hold."""
    beat = heartbeat_beat_call(leases, lease)
    return Call(beat.name, beat.params, lambda rows: _beat(rows).held)


def complete_call(leases: Sequence[Lease]) -> Call[set[int]]:
    return Call("claim_complete", _lease_map(_newest_leases(leases)), int_set)


def complete_deleting_call(leases: Sequence[Lease]) -> Call[set[int]]:
    """Complete jobs without a key by deleting them (counted in done_tally); the ids of keyed
    jobs and of lost leases are missing from the result: pass those to complete_call."""
    return Call("claim_complete_deleting", _lease_map(_newest_leases(leases)), int_set)


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
    return Call("claim_fail", params, _fail_outcomes)


def fail_permanently_call(leases: Sequence[Lease], errors: Sequence[str]) -> Call[set[int]]:
    params = {**_leases(leases), "errors": [clip_error(e) for e in errors]}
    return Call("claim_fail_permanently", params, int_set)


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
    return Call("claim_release", params, int_set)


def release_unanswered_call(worker: str, held: Sequence[int]) -> Call[set[int]]:
    """Return to ready, uncounted, the jobs running under `worker`'s name but not in `held`:
    what a claim whose answer was lost took (see the statement)."""
    return Call("claim_release_unanswered", {"worker": worker, "held": list(held)}, int_set)


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
    return Call("claim_reap", _reap_params(limit, own), _reaped)


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
    return Call("claim_reap", params, _reap_round)


# -- the claiming connection ------------------------------------------------------------


async def claim_session(conn: psycopg.AsyncConnection[Any], schema: str = DEFAULT_SCHEMA) -> None:
    """Settings of the claiming connection: the claim must walk the ready index in order,
    and its rows should cost the worker little to read.

    After a bulk enqueue, statistics lag (autovacuum analyzes later) and the planner may
    choose a bitmap scan that sorts every ready row to take the first few hundred; on this
    connection, which runs nothing but claims, those plans are switched off.
    """
    await conn.execute(statements(schema)["claim_session"])


async def claim_transaction(conn: psycopg.AsyncConnection[Any], schema: str = DEFAULT_SCHEMA) -> None:
    """`claim_session`'s planner settings for one claim's transaction only, behind a
    transaction pooler."""
    await conn.execute(statements(schema)["claim_transaction"])


async def subscribe(conn: psycopg.AsyncConnection[Any], schema: str = DEFAULT_SCHEMA) -> None:
    """Subscribe `conn` to the schema's channel: every insert into the job table notifies it,
    and operators' cancels and orders go through it too."""
    await conn.execute(statements(schema)["claim_listen"])
