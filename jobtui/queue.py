"""The queue's operations: enqueue, claim, heartbeat, complete, fail, release, reap, and the
operator's requeue, kill-lease and cancel.

Each operation is built once as a `Call` (statement name, parameters, decoder) and run by
the sync `Queue` or the async `AsyncQueue`, or by a worker on its own connection.

    queue = Queue("postgresql://localhost/app")
    job_id = queue.enqueue("email.send", {"user_id": 42}, key="welcome:42")
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from psycopg.rows import dict_row
from psycopg.types.numeric import Int4, Int8
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from . import migrate
from .db import Call as Call  # re-exported: the operations and their runner travel together
from .db import Rows, check_dsn, connect, connect_timeout, resolve_dsn, statements, unavailable
from .db import arun as arun
from .db import run as run
from .domain import (
    DEFAULT_LEASE_SECONDS,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_SCHEMA,
    MAX_DELAY_SECONDS,
    MAX_PAYLOAD_BYTES,
    ClaimedJob,
    ErrorEntry,
    FailOutcome,
    Failure,
    JobRow,
    JobStatus,
    Lease,
    NewJob,
    Reaped,
)
from .errors import InvalidInput
from .safetext import quote

T = TypeVar("T")

# Error texts are kept whole up to this size; longer ones (huge tracebacks) are cut.
MAX_ERROR_CHARS = 8000
MAX_TYPE_CHARS = 200
MAX_KEY_CHARS = 1000
COPY_THRESHOLD = 1000


# -- validation ---------------------------------------------------------------------------


# json.dumps with non-default options builds a new encoder per call; bulk enqueue encodes
# one payload per job, so the encoder is built once (same options, same output).
_JSON_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False)
_JSON_DECODER = json.JSONDecoder()


def encode_payload(payload: Any) -> str:
    """The payload as JSON text, or InvalidInput saying why it cannot be stored."""
    try:
        text = _JSON_ENCODER.encode({} if payload is None else payload)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"payload is not JSON-serialisable ({exc}); pass dicts, lists, str, numbers") from None
    except RecursionError:
        raise InvalidInput("payload nests too deeply to encode; flatten it") from None
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidInput("payload holds text that is not valid UTF-8; clean it before enqueueing") from None
    if "\\u0000" in text or "\x00" in text:
        raise InvalidInput("payload holds a NUL character, which PostgreSQL cannot store in jsonb")
    if size > MAX_PAYLOAD_BYTES:
        raise InvalidInput(
            f"payload is {size} bytes, over the {MAX_PAYLOAD_BYTES} limit; "
            "store the data elsewhere and pass a reference"
        )
    return text


def check_text(value: str, what: str) -> str:
    """`value` if PostgreSQL can store it as text: no NUL, and valid UTF-8 (no lone surrogates,
    which is how Python decodes bytes that are not UTF-8, e.g. in argv or file names)."""
    if "\x00" in value:
        raise InvalidInput(f"bad {what}: it holds a NUL character, which PostgreSQL cannot store")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"bad {what} {quote(value)}: it is not valid UTF-8 text") from None
    return value


def check_type(job_type: str) -> str:
    if not isinstance(job_type, str) or not job_type.strip() or len(job_type) > MAX_TYPE_CHARS:
        raise InvalidInput(
            f"bad job type {quote(job_type)}: give a non-empty name of at most {MAX_TYPE_CHARS} characters"
        )
    return check_text(job_type, "job type")


def check_key(key: str | None) -> str | None:
    if key is None:
        return None
    if not key or len(key) > MAX_KEY_CHARS or "\x00" in key:
        raise InvalidInput(f"bad idempotency key {quote(key)}: give 1 to {MAX_KEY_CHARS} characters, no NUL")
    return check_text(key, "idempotency key")


def check_delay(delay: float) -> float:
    if not isinstance(delay, (int, float)) or not math.isfinite(delay) or delay < 0 or delay > MAX_DELAY_SECONDS:
        raise InvalidInput(f"bad delay {quote(delay)}: give seconds between 0 and 10 years")
    return float(delay)


def check_lease(lease: float) -> float:
    if not isinstance(lease, (int, float)) or not math.isfinite(lease) or lease < 0 or lease > 10 * 365 * 86400:
        raise InvalidInput(f"bad lease {quote(lease)}: give seconds between 0 and 10 years")
    return float(lease)


def check_run_at(run_at: Any) -> Any:
    """None (now) or a timezone-aware datetime: a naive one would be read in the session's zone."""
    if run_at is not None and not (isinstance(run_at, datetime) and run_at.utcoffset() is not None):
        raise InvalidInput(f"bad run_at {quote(run_at)}: give a timezone-aware datetime")
    return run_at


def check_max_attempts(max_attempts: int | None) -> int | None:
    """None leaves the limit to the job's handler (or the default of 25)."""
    if max_attempts is None:
        return None
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or not 1 <= max_attempts <= 1000:
        raise InvalidInput(f"bad max attempts {quote(max_attempts)}: give a whole number from 1 to 1000")
    return max_attempts


def clip_error(error: str) -> str:
    """An error text that fits the row: NULs removed, text that is not UTF-8 (lone surrogates,
    from undecodable bytes in a message) escaped, long texts cut in the middle."""
    # Whatever a handler raised, its outcome must be writable.
    error = error.replace("\x00", "").encode("utf-8", "backslashreplace").decode("utf-8")
    if len(error) <= MAX_ERROR_CHARS:
        return error
    half = MAX_ERROR_CHARS // 2
    return f"{error[:half]}\n... [{len(error) - MAX_ERROR_CHARS} characters cut] ...\n{error[-half:]}"


# -- calls --------------------------------------------------------------------------------


def _first_id(rows: Rows) -> int | None:
    return int(rows[0][0]) if rows else None


def _ids(rows: Rows) -> set[int]:
    return {int(r[0]) for r in rows}


def _id_list(rows: Rows) -> list[int]:
    return [int(r[0]) for r in rows]


def _leases(leases: Sequence[Lease]) -> dict[str, Any]:
    # Sent as bigint[] (binary, where the statement says %(ids)b): a list of small ints goes
    # as smallint[] or int[], whose cast in `(tokens)[array_position(ids, id)]` would be
    # redone for every row; and the text form is escaped element by element.
    return {"ids": [Int8(lease.job_id) for lease in leases], "tokens": [Int8(lease.token) for lease in leases]}


def enqueue_call(
    job_type: str,
    payload: Any = None,
    *,
    key: str | None = None,
    delay: float = 0.0,
    run_at: Any = None,
    max_attempts: int | None = None,
) -> Call[int | None]:
    params = {
        "type": check_type(job_type),
        "payload": encode_payload(payload),
        "key": check_key(key),
        "delay": check_delay(delay),
        "run_at": check_run_at(run_at),
        "max_attempts": check_max_attempts(max_attempts),
    }
    return Call("enqueue", params, _first_id)


def enqueue_many_params(jobs: Sequence[NewJob]) -> dict[str, Any]:
    return {
        "types": [check_type(j.type) for j in jobs],
        "payloads": [encode_payload(j.payload) for j in jobs],
        "keys": [check_key(j.key) for j in jobs],
        "delays": [check_delay(j.delay) for j in jobs],
        "max_attempts": [check_max_attempts(j.max_attempts) for j in jobs],
    }


def _claimed(rows: Rows) -> list[ClaimedJob]:
    """The claimed jobs in the order they were waiting: run_at, then id."""
    rows = sorted(rows, key=lambda r: (r[8], r[0]))
    return [
        ClaimedJob(
            id=r[0],
            type=r[1],
            payload=_JSON_DECODER.decode(r[2]),
            attempt=r[3],
            max_attempts=r[4],
            lease_token=r[5],
            locked_until=r[6],
            created_at=r[7],
            run_at=r[8],
            uncounted=r[9],
        )
        for r in rows
    ]


def claim_call(
    types: Sequence[str],
    *,
    worker: str,
    limit: int,
    lease: float = DEFAULT_LEASE_SECONDS,
    max_attempts: Mapping[str, int] | None = None,
) -> Call[list[ClaimedJob]]:
    """Claim up to `limit` jobs of `types`; jobs enqueued without a limit of attempts take
    theirs from `max_attempts` (by type, usually the handlers'), else DEFAULT_MAX_ATTEMPTS."""
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
    }
    return Call("claim", params, _claimed, binary=True)


def _newest_leases(leases: Sequence[Lease]) -> list[Lease]:
    """One lease per job, the one with the highest token: complete and heartbeat look a job's
    token up by its first position, and a job's current token is never lower than any token
    handed out for it, so an older lease of the same job in the batch can only be stale."""
    newest: dict[int, Lease] = {}
    for lease in leases:
        held = newest.get(lease.job_id)
        if held is None or lease.token > held.token:
            newest[lease.job_id] = lease
    return list(newest.values()) if len(newest) < len(leases) else list(leases)


def heartbeat_call(leases: Sequence[Lease], lease: float = DEFAULT_LEASE_SECONDS) -> Call[set[int]]:
    return Call("heartbeat", {**_leases(_newest_leases(leases)), "lease": check_lease(lease)}, _ids)


def complete_call(leases: Sequence[Lease]) -> Call[set[int]]:
    return Call("complete", _leases(_newest_leases(leases)), _ids)


def complete_deleting_call(leases: Sequence[Lease]) -> Call[set[int]]:
    """Complete jobs without a key by deleting them (counted in done_tally); the ids of keyed
    jobs and of lost leases are missing from the result: pass those to complete_call."""
    return Call("complete_deleting", _leases(_newest_leases(leases)), _ids)


def _fail_outcomes(rows: Rows) -> list[FailOutcome]:
    return [FailOutcome(r[0], JobStatus(r[1]), r[2], r[3], r[4], r[5]) for r in rows]


def fail_call(failures: Sequence[Failure]) -> Call[list[FailOutcome]]:
    params = {
        **_leases([f.lease for f in failures]),
        "delays": [check_delay(f.delay) for f in failures],
        "errors": [clip_error(f.error) for f in failures],
    }
    return Call("fail", params, _fail_outcomes)


def fail_permanently_call(leases: Sequence[Lease], errors: Sequence[str]) -> Call[set[int]]:
    params = {**_leases(leases), "errors": [clip_error(e) for e in errors]}
    return Call("fail_permanently", params, _ids)


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
    return Call("release", params, _ids)


def _reaped(rows: Rows) -> list[Reaped]:
    # The first row is the round itself (see the statement), not a job.
    return [Reaped(r[0], r[1], r[2], r[3], JobStatus(r[4]), r[5]) for r in rows if r[0] is not None]


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
    marker = next(r for r in rows if r[0] is None)
    return ReapRound(marker[5], marker[1] == "open", _reaped(rows))


def reap_round_call(
    previous: datetime | None, continuity: float, limit: int = 1000, own: Sequence[int] = ()
) -> Call[ReapRound]:
    """A worker reaper's round: reaps only when its `previous` round ran less than
    `continuity` seconds before this one, by the database's clock."""
    params = {**_reap_params(limit, own), "previous": previous, "continuity": float(continuity)}
    return Call("reap", params, _reap_round)


def requeue_call(ids: Sequence[int], actor: str) -> Call[list[int]]:
    return Call("requeue_by_id", {"ids": list(ids), "actor": actor}, _id_list)


def dead_matching(
    conn: psycopg.Connection[Any],
    schema: str = DEFAULT_SCHEMA,
    *,
    job_type: str | None = None,
    error: str | None = None,
    group: tuple[str, str | None] | None = None,
    with_ids: bool = False,
) -> list[dict[str, Any]]:
    """The dead and failed jobs of `job_type` whose error matches `error`, grouped by status,
    type and error fingerprint (`group`: only the (status, fingerprint) group of the type),
    largest group first; with their ids when `with_ids`.

    The one matcher behind `jobtui dead --error`, `jobtui requeue --error` (and its dry run)
    and the console's dead groups: a case-insensitive PostgreSQL regular expression on the
    error's first line or its fingerprint (queries.sql, dead_matching). Check the pattern
    with `check_regex` first for a one-line error.
    """
    if job_type is not None:
        check_text(job_type, "job type")
    if error is not None:
        check_text(error, "--error pattern")
    status, fingerprint = group or (None, None)
    params = {
        "type": job_type,
        "error": error,
        "status": status,
        "in_group": group is not None,
        "fingerprint": fingerprint or None,
        "with_ids": with_ids,
    }
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(statements(schema)["dead_matching"], params)
        return cur.fetchall()


def matching_ids(groups: list[dict[str, Any]]) -> list[int]:
    """The ids of `dead_matching` groups read with their ids, in id order."""
    return sorted(int(i) for g in groups for i in g["job_ids"])


def check_regex(conn: psycopg.Connection[Any], pattern: str | None, schema: str = DEFAULT_SCHEMA) -> None:
    """InvalidInput unless PostgreSQL, which does the matching, accepts `pattern`."""
    if pattern is None:
        return
    check_text(pattern, "--error pattern")
    if not pattern:
        raise InvalidInput("--error '' matches every job: give a pattern, or --all for every dead/failed job")
    try:
        run(conn, Call("check_regex", {"pattern": pattern}, lambda rows: None), schema)
    except psycopg.errors.InvalidRegularExpression as exc:
        first = str(exc).strip().splitlines()[0]
        raise InvalidInput(f"bad --error pattern {pattern!r}: {first}; it is a regular expression") from None


def kill_lease_call(ids: Sequence[int], actor: str) -> Call[list[int]]:
    return Call("kill_lease", {"ids": list(ids), "actor": actor}, _id_list)


def cancel_call(ids: Sequence[int], actor: str) -> Call[list[int]]:
    return Call("cancel", {"ids": list(ids), "actor": actor}, _id_list)


def _job_row(rows: Rows) -> JobRow | None:
    if not rows:
        return None
    r = rows[0]
    errors = [
        ErrorEntry(
            at=str(e.get("at", "")),
            attempt=int(e.get("attempt") or 0),
            worker=e.get("worker"),
            kind=str(e.get("kind", "error")),
            error=str(e.get("error", "")),
        )
        for e in (r[13] or [])
    ]
    return JobRow(
        id=r[0],
        type=r[1],
        payload=r[2],
        idempotency_key=r[3],
        status=JobStatus(r[4]),
        run_at=r[5],
        attempts=r[6],
        max_attempts=r[7],
        locked_by=r[8],
        locked_until=r[9],
        lease_token=r[10],
        heartbeat_at=r[11],
        last_error=r[12],
        errors=errors,
        lease_expirations=r[14],
        created_at=r[15],
        started_at=r[16],
        finished_at=r[17],
        db_now=r[18],
    )


def get_job_call(job_id: int) -> Call[JobRow | None]:
    return Call("get_job", {"id": job_id}, _job_row)


def job_statuses_call(ids: Sequence[int]) -> Call[dict[int, JobStatus]]:
    return Call("job_statuses", {"ids": list(ids)}, lambda rows: {int(r[0]): JobStatus(r[1]) for r in rows})


# -- running calls ------------------------------------------------------------------------


def _copy_rows(ids: Sequence[int], jobs: Sequence[NewJob], params: dict[str, Any]) -> Iterable[tuple[Any, ...]]:
    return zip(ids, params["types"], params["payloads"], params["max_attempts"], strict=True)


def _can_copy(jobs: Sequence[NewJob]) -> bool:
    # COPY cannot skip duplicate keys or add a delay to the database's clock.
    return len(jobs) >= COPY_THRESHOLD and all(j.key is None and j.delay == 0 for j in jobs)


def _merge_existing(jobs: Sequence[NewJob], inserted: Rows, existing: Rows) -> list[int]:
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

    A job whose key already exists is not inserted; its existing id is returned.
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
                for row in _copy_rows(ids, jobs, params):
                    copy.write_row(row)
            return ids
        cur.execute(stmts["enqueue_many"], params)
        inserted = cur.fetchall()
        existing: Rows = []
        if len(inserted) < len(jobs):
            missing = list({j.key for j in jobs if j.key is not None} - {k for _, k in inserted})
            cur.execute(stmts["enqueue_existing_many"], {"keys": missing})
            existing = cur.fetchall()
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
                for row in _copy_rows(ids, jobs, params):
                    await copy.write_row(row)
            return ids
        await cur.execute(stmts["enqueue_many"], params)
        inserted = await cur.fetchall()
        existing: Rows = []
        if len(inserted) < len(jobs):
            missing = list({j.key for j in jobs if j.key is not None} - {k for _, k in inserted})
            await cur.execute(stmts["enqueue_existing_many"], {"keys": missing})
            existing = await cur.fetchall()
    return _merge_existing(jobs, inserted, existing)


def enqueue(conn: psycopg.Connection[Any], call: Call[int | None], schema: str = DEFAULT_SCHEMA) -> int:
    """Run an enqueue call; with a key that exists already, the existing job's id."""
    job_id = run(conn, call, schema)
    if job_id is None:
        job_id = run(conn, Call("enqueue_existing", {"key": call.params["key"]}, _first_id), schema)
    if job_id is None:
        # The job holding the key was deleted between the two statements: insert again.
        return enqueue(conn, call, schema)
    return job_id


async def aenqueue(conn: psycopg.AsyncConnection[Any], call: Call[int | None], schema: str = DEFAULT_SCHEMA) -> int:
    """Async counterpart of `enqueue`."""
    job_id = await arun(conn, call, schema)
    if job_id is None:
        job_id = await arun(conn, Call("enqueue_existing", {"key": call.params["key"]}, _first_id), schema)
    if job_id is None:
        return await aenqueue(conn, call, schema)
    return job_id


# complete and heartbeat find each id's token by a linear search of the batch: batches of a
# thousand cost about what a join did, far larger ones grow with the square of their size.
LEASE_CHUNK = 1000


def _chunks(leases: Sequence[Lease]) -> list[Sequence[Lease]]:
    return [leases[i : i + LEASE_CHUNK] for i in range(0, len(leases), LEASE_CHUNK)] or [leases]


def _autocommitted(conn: psycopg.Connection[Any], fn: Callable[[], T]) -> T:
    """Run `fn` with each statement committing by itself, on a pooled connection.

    A lone enqueue then costs one round trip instead of three (BEGIN, INSERT, COMMIT), and
    the time from enqueue to a worker starting the job is mostly that round trip. With a key
    that exists, the second statement reads the committed row; `enqueue` retries if it went.
    """
    conn.autocommit = True
    try:
        return fn()
    finally:
        with contextlib.suppress(psycopg.Error):  # a broken connection is discarded anyway
            conn.autocommit = False


# -- clients ------------------------------------------------------------------------------

# How long a client call waits for a connection while the database is away, by default.
DEFAULT_CLIENT_TIMEOUT = 10.0


def _client_settings(dsn: str | None, schema: str, timeout: float) -> tuple[str, str, float]:
    """The checked DSN, schema and timeout of a Queue or AsyncQueue."""
    resolved = resolve_dsn(dsn)
    if resolved is None:
        raise InvalidInput("no database given: pass a DSN or set JOBTUI_DSN")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 3600:
        raise InvalidInput(f"bad timeout {timeout!r}: give seconds, more than 0 and at most 3600")
    return check_dsn(resolved), statements(schema).schema, float(timeout)


def _reachable(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether the connection still works after an error (the error was the statement's)."""
    return not (conn.closed or conn.broken)


class Queue:
    """The sync client: enqueue from application code, operate the queue from scripts.

    queue = jobtui.Queue(dsn)
    queue.enqueue("email.send", {"user_id": 42}, key="welcome:42")
    with psycopg.connect(dsn) as conn:      # the job commits with this transaction
        queue.enqueue("email.send", {"user_id": 43}, conn=conn)
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        schema: str = DEFAULT_SCHEMA,
        max_connections: int = 4,
        timeout: float = DEFAULT_CLIENT_TIMEOUT,
    ) -> None:
        self.dsn, self.schema, self.timeout = _client_settings(dsn, schema, timeout)
        self._max_connections = max_connections
        self._pool: ConnectionPool[Any] | None = None

    def _get_pool(self) -> ConnectionPool[Any]:
        if self._pool is None:
            self._pool = ConnectionPool(
                self.dsn,
                min_size=1,
                max_size=self._max_connections,
                open=False,
                kwargs=connect_timeout(self.dsn),
                # A connection the server dropped (a restart) is found out and replaced
                # when it is handed out, not by the caller's statement failing.
                check=ConnectionPool.check_connection,
            )
            self._pool.open(wait=False)
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _with_conn(self, conn: psycopg.Connection[Any] | None, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        if conn is not None:
            return fn(conn)
        try:
            with self._get_pool().connection(timeout=self.timeout) as pooled:
                try:
                    return fn(pooled)
                except psycopg.OperationalError as exc:
                    if _reachable(pooled):
                        raise  # about the statement (a deadlock, a timeout), not the server
                    raise unavailable(self.dsn, exc) from None
        except PoolTimeout as exc:
            raise unavailable(self.dsn, exc, waited=self.timeout) from None

    def run(self, call: Call[T], conn: psycopg.Connection[Any] | None = None) -> T:
        """Run any `Call` (in `conn`'s transaction when given, else in its own)."""
        return self._with_conn(conn, lambda c: run(c, call, self.schema))

    def check_schema(self) -> int:
        """Raise SchemaNotMigrated unless `jobtui migrate` has been run for this code."""
        with connect(self.dsn) as conn:
            return migrate.check(conn, self.schema)

    def enqueue(
        self,
        job_type: str,
        payload: Any = None,
        *,
        key: str | None = None,
        delay: float = 0.0,
        run_at: Any = None,
        max_attempts: int | None = None,
        conn: psycopg.Connection[Any] | None = None,
    ) -> int:
        """Insert one job and return its id; a key that exists returns the existing job's id."""
        call = enqueue_call(job_type, payload, key=key, delay=delay, run_at=run_at, max_attempts=max_attempts)
        if conn is not None:
            return enqueue(conn, call, self.schema)
        return self._with_conn(None, lambda c: _autocommitted(c, lambda: enqueue(c, call, self.schema)))

    def enqueue_many(self, jobs: Iterable[NewJob], *, conn: psycopg.Connection[Any] | None = None) -> list[int]:
        """Insert many jobs in one statement (COPY for large batches); ids in input order."""
        batch = list(jobs)
        return self._with_conn(conn, lambda c: enqueue_many(c, batch, self.schema))

    def claim(
        self, types: Sequence[str], *, worker: str, limit: int = 1, lease: float = DEFAULT_LEASE_SECONDS
    ) -> list[ClaimedJob]:
        return self.run(claim_call(types, worker=worker, limit=limit, lease=lease))

    def heartbeat(self, leases: Sequence[Lease], lease: float = DEFAULT_LEASE_SECONDS) -> set[int]:
        """Extend leases; returns the ids still held (the others were lost)."""
        return {i for chunk in _chunks(leases) for i in self.run(heartbeat_call(chunk, lease))}

    def complete(self, leases: Sequence[Lease], *, delete: bool = False) -> set[int]:
        """Mark jobs done; returns the ids written (a missing id lost its lease).

        delete=True deletes jobs without a key instead, counting them in done_tally (what
        `jobtui worker --delete-on-complete` does); keyed jobs are kept as done rows.
        """
        written: set[int] = set()
        for chunk in _chunks(leases):
            if delete:
                deleted = self.run(complete_deleting_call(chunk))
                written.update(deleted)
                chunk = [lease for lease in chunk if lease.job_id not in deleted]
            if chunk:
                completed = self.run(complete_call(chunk))
                written.update(completed)
        return written

    def fail(self, failures: Sequence[Failure]) -> list[FailOutcome]:
        """Record counted failures; jobs out of attempts go dead. Lost leases are left out."""
        return self.run(fail_call(failures))

    def fail_permanently(self, leases: Sequence[Lease], errors: Sequence[str]) -> set[int]:
        return self.run(fail_permanently_call(leases, errors))

    def release(
        self,
        leases: Sequence[Lease],
        delays: Sequence[float] | None = None,
        *,
        kinds: Sequence[str] | None = None,
        reasons: Sequence[str] | None = None,
    ) -> set[int]:
        """Return jobs to ready without counting the attempt; each gets a history entry of
        its kind (RELEASE_KINDS, default "shutdown") and reason."""
        return self.run(release_call(leases, delays, kinds=kinds, reasons=reasons))

    def reap(self, limit: int = 1000) -> list[Reaped]:
        """Return expired leases to ready (or dead when attempts are spent)."""
        return self.run(reap_call(limit))

    def get(self, job_id: int) -> JobRow | None:
        return self.run(get_job_call(job_id))

    def requeue(self, ids: Sequence[int], *, actor: str) -> list[int]:
        """Move dead or failed jobs back to ready; returns the ids moved. Audited."""
        return self._operate(requeue_call(ids, actor), "requeue", actor, _ids_target(ids), notify=True)

    def requeue_matching(self, *, job_type: str | None = None, error: str | None = None, actor: str) -> list[int]:
        """Requeue every dead or failed job of `job_type` whose error matches `error` (see
        `dead_matching`: the rows `jobtui dead --error` lists). Audited."""
        self._with_conn(None, lambda c: check_regex(c, error, self.schema))

        def matched_then_requeued(conn: psycopg.Connection[Any]) -> list[int]:
            ids = matching_ids(dead_matching(conn, self.schema, job_type=job_type, error=error, with_ids=True))
            return run(conn, requeue_call(ids, actor), self.schema) if ids else []

        return self._operate(matched_then_requeued, "requeue", actor, _match_target(job_type, error), notify=True)

    def requeueable(
        self, *, job_type: str | None = None, error: str | None = None, actor: str | None = None
    ) -> list[int]:
        """The ids `requeue_matching` would move now; audited as a dry run when `actor` is given."""

        def matched(conn: psycopg.Connection[Any]) -> list[int]:
            check_regex(conn, error, self.schema)
            return matching_ids(dead_matching(conn, self.schema, job_type=job_type, error=error, with_ids=True))

        ids = self._with_conn(None, matched)
        if actor is not None:
            self._operate(None, "requeue-dry-run", actor, _match_target(job_type, error), rows=len(ids))
        return ids

    def count_requeueable(
        self, *, job_type: str | None = None, error: str | None = None, actor: str | None = None
    ) -> int:
        """How many jobs `requeue_matching` would move; audited as a dry run when `actor` is given."""
        return len(self.requeueable(job_type=job_type, error=error, actor=actor))

    def requeue_dead_group(
        self, status: str, job_type: str, fingerprint: str | None, *, actor: str, ids: Sequence[int] | None = None
    ) -> list[int]:
        """Requeue one dead-letter group (status, type, error fingerprint) as the console
        shows it: the given `ids` of it (those an operator was shown and confirmed; one that
        left the group since is left alone), or else every job in it now. Audited."""
        fingerprint = fingerprint or None

        def requeued(conn: psycopg.Connection[Any]) -> list[int]:
            chosen = list(ids) if ids is not None else None
            if chosen is None:
                groups = dead_matching(conn, self.schema, job_type=job_type, group=(status, fingerprint), with_ids=True)
                chosen = matching_ids(groups)
            params = {"ids": chosen, "status": status, "type": job_type, "fingerprint": fingerprint, "actor": actor}
            return run(conn, Call("dead_group_requeue", params, _id_list), self.schema) if chosen else []

        target = f"{status} group type={job_type} error={fingerprint or '-'}"
        return self._operate(requeued, "requeue", actor, target, notify=True)

    def kill_lease(self, ids: Sequence[int], *, actor: str) -> list[int]:
        """Return running jobs to ready now; their workers' late outcomes are rejected. Audited."""
        return self._operate(kill_lease_call(ids, actor), "kill-lease", actor, _ids_target(ids), notify=True)

    def cancel(self, ids: Sequence[int], *, actor: str) -> list[int]:
        """Mark ready or running jobs failed. Audited."""
        return self._operate(cancel_call(ids, actor), "cancel", actor, _ids_target(ids))

    def audit(self, limit: int = 100) -> list[AuditEntry]:
        """The newest operator actions first."""
        return self.run(audit_list_call(limit))

    def _operate(
        self,
        call: Call[list[int]] | Callable[[psycopg.Connection[Any]], list[int]] | None,
        action: str,
        actor: str,
        target: str,
        *,
        notify: bool = False,
        rows: int | None = None,
    ) -> list[int]:
        """Run an operator's change and its audit row in one transaction."""
        check_text(actor, "actor")

        def both(conn: psycopg.Connection[Any]) -> list[int]:
            with conn.transaction():
                # A Call, or a function of the connection for a change of several statements.
                ids = call(conn) if callable(call) else run(conn, call, self.schema) if call is not None else []
                run(conn, audit_call(actor, action, target, ids, len(ids) if rows is None else rows), self.schema)
                if notify and ids:
                    channel = statements(self.schema).channel
                    run(conn, Call("notify_ready", {"channel": channel}, lambda r: None), self.schema)
            return ids

        return self._with_conn(None, both)


def _match_target(job_type: str | None, error: str | None) -> str:
    return f"type={job_type or '*'} error={error or '*'}"


def _ids_target(ids: Sequence[int]) -> str:
    shown = ",".join(str(i) for i in list(ids)[:20])
    return f"jobs {shown}{'...' if len(ids) > 20 else ''}"


@dataclass(frozen=True, slots=True)
class AuditEntry:
    id: int
    at: Any
    actor: str
    action: str
    target: str | None
    job_ids: list[int]
    rows: int
    detail: Any


def audit_call(
    actor: str, action: str, target: str | None, job_ids: Sequence[int], rows: int, detail: Any = None
) -> Call[int]:
    params = {
        "actor": check_text(actor, "actor"),
        "action": action,
        "target": target,
        "job_ids": list(job_ids),
        "rows": rows,
        "detail": json.dumps(detail or {}),
    }
    return Call("audit_insert", params, lambda r: int(r[0][0]))


def audit_list_call(limit: int) -> Call[list[AuditEntry]]:
    return Call("audit_list", {"limit": limit}, lambda rows: [AuditEntry(*r) for r in rows])


def record_audit(
    conn: psycopg.Connection[Any],
    actor: str,
    action: str,
    target: str | None,
    rows: int,
    *,
    job_ids: Sequence[int] = (),
    detail: Any = None,
    schema: str = DEFAULT_SCHEMA,
) -> int:
    """Write one audit row on `conn` (in its transaction)."""
    return run(conn, audit_call(actor, action, target, job_ids, rows, detail), schema)


class AsyncQueue:
    """The asyncio client for enqueueing from async applications.

    queue = jobtui.AsyncQueue(dsn)
    await queue.enqueue("email.send", {"user_id": 42})
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        schema: str = DEFAULT_SCHEMA,
        max_connections: int = 4,
        timeout: float = DEFAULT_CLIENT_TIMEOUT,
    ) -> None:
        self.dsn, self.schema, self.timeout = _client_settings(dsn, schema, timeout)
        self._max_connections = max_connections
        self._pool: AsyncConnectionPool[Any] | None = None

    async def _get_pool(self) -> AsyncConnectionPool[Any]:
        if self._pool is None:
            self._pool = AsyncConnectionPool(
                self.dsn,
                min_size=1,
                max_size=self._max_connections,
                open=False,
                kwargs=connect_timeout(self.dsn),
                check=AsyncConnectionPool.check_connection,  # see Queue
            )
            await self._pool.open(wait=False)
        return self._pool

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def __aenter__(self) -> AsyncQueue:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _with_conn(
        self,
        conn: psycopg.AsyncConnection[Any] | None,
        fn: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]],
        *,
        autocommit: bool = False,
    ) -> T:
        """`fn` on `conn`, or on a pooled connection with the errors of `Queue._with_conn`."""
        if conn is not None:
            return await fn(conn)
        try:
            async with (await self._get_pool()).connection(timeout=self.timeout) as pooled:
                try:
                    if not autocommit:
                        return await fn(pooled)
                    await pooled.set_autocommit(True)  # see _autocommitted
                    try:
                        return await fn(pooled)
                    finally:
                        with contextlib.suppress(psycopg.Error):  # a broken connection is discarded anyway
                            await pooled.set_autocommit(False)
                except psycopg.OperationalError as exc:
                    if _reachable(pooled):
                        raise
                    raise unavailable(self.dsn, exc) from None
        except PoolTimeout as exc:
            raise unavailable(self.dsn, exc, waited=self.timeout) from None

    async def run(self, call: Call[T], conn: psycopg.AsyncConnection[Any] | None = None) -> T:
        """Run any `Call` (in `conn`'s transaction when given, else in its own)."""
        return await self._with_conn(conn, lambda c: arun(c, call, self.schema))

    async def enqueue(
        self,
        job_type: str,
        payload: Any = None,
        *,
        key: str | None = None,
        delay: float = 0.0,
        run_at: Any = None,
        max_attempts: int | None = None,
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> int:
        """Insert one job and return its id; a key that exists returns the existing job's id."""
        call = enqueue_call(job_type, payload, key=key, delay=delay, run_at=run_at, max_attempts=max_attempts)
        return await self._with_conn(conn, lambda c: aenqueue(c, call, self.schema), autocommit=conn is None)

    async def enqueue_many(
        self, jobs: Iterable[NewJob], *, conn: psycopg.AsyncConnection[Any] | None = None
    ) -> list[int]:
        """Insert many jobs in one statement (COPY for large batches); ids in input order."""
        batch = list(jobs)
        return await self._with_conn(conn, lambda c: aenqueue_many(c, batch, self.schema))


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
