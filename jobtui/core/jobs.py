"""Jobs: enqueue them (one, many, by COPY), read one job and the statuses of many, wake the
workers, and the handlers' effect records. The one module that names the statements of
sql/jobs.sql.

Each operation is built once as a `Call` (statement name, parameters, decoder) and run by a
client (client.py), or on a connection of the caller's.

    with connect(dsn) as conn:
        job_id = enqueue(conn, enqueue_call("email.send", {"user_id": 42}, key="welcome:42"))
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypedDict, Unpack

import psycopg
from psycopg.rows import TupleRow

from jobtui.kernel.checks import (
    check_delay,
    check_key,
    check_max_attempts,
    check_queue,
    check_run_at,
    check_type,
    encode_payload,
)
from jobtui.kernel.db import SERVER_TCP_SETTINGS, Call, Rows, arun, first_int, run, server_tcp_params, statements
from jobtui.kernel.domain import (
    DEFAULT_QUEUE,
    DEFAULT_SCHEMA,
    ErrorEntry,
    JobRow,
    JobStatus,
    NewJob,
    Runner,
)
from jobtui.kernel.errors import InvalidInput

COPY_THRESHOLD = 1000


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
    return Call("job_enqueue" if params["key"] is None else "job_enqueue_keyed", params, first_int)


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


def _job_row(rows: Rows) -> JobRow | None:
    if not rows:
        return None
    row = rows.dicts()[0]
    held = row.pop("errors") or []
    errors = [ErrorEntry.decoded(e) for e in (held if isinstance(held, list) else [held])]
    return JobRow(
        **{**row, "status": JobStatus(row["status"]), "runner": Runner.decoded(row.get("runner"))}, errors=errors
    )


def get_job_call(job_id: int) -> Call[JobRow | None]:
    return Call("job_get", {"id": job_id}, _job_row)


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
    return "job_enqueue_many" if all(j.key is None for j in jobs) else "job_enqueue_many_keyed"


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
            cur.execute(stmts["job_ids_reserve"], {"table": f'"{schema}".job', "n": len(jobs)})
            ids = [int(r[0]) for r in cur.fetchall()]
            with cur.copy(stmts["job_copy"]) as copy:
                for row in _copy_rows(ids, params):
                    copy.write_row(row)
            return ids
        cur.execute(stmts[_many_statement(jobs)], params)
        inserted = cur.fetchall()
        existing: list[TupleRow] = []
        missing = _missing(jobs, inserted)
        if missing:
            cur.execute(stmts["job_enqueue_existing_many"], {"keys": missing})
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
            await cur.execute(stmts["job_ids_reserve"], {"table": f'"{schema}".job', "n": len(jobs)})
            ids = [int(r[0]) for r in await cur.fetchall()]
            async with cur.copy(stmts["job_copy"]) as copy:
                for row in _copy_rows(ids, params):
                    await copy.write_row(row)
            return ids
        await cur.execute(stmts[_many_statement(jobs)], params)
        inserted = await cur.fetchall()
        existing: list[TupleRow] = []
        missing = _missing(jobs, inserted)
        if missing:
            await cur.execute(stmts["job_enqueue_existing_many"], {"keys": missing})
            existing = await cur.fetchall()
    gone = _gone(jobs, inserted + existing)
    if gone:
        existing += list(zip(await aenqueue_many(conn, gone, schema), [j.key for j in gone], strict=True))
    return _merge_existing(jobs, inserted, existing)


def enqueue(conn: psycopg.Connection[Any], call: Call[int | None], schema: str = DEFAULT_SCHEMA) -> int:
    """Run an enqueue call; with a key that is held already, the id of the job holding it."""
    job_id = run(conn, call, schema)
    if job_id is None:
        job_id = run(conn, Call("job_enqueue_existing", {"key": call.params["key"]}, first_int), schema)
    if job_id is None:
        # The key's window passed and the archiver forgot it between the two statements.
        return enqueue(conn, call, schema)
    return job_id


async def aenqueue(conn: psycopg.AsyncConnection[Any], call: Call[int | None], schema: str = DEFAULT_SCHEMA) -> int:
    """Async counterpart of `enqueue`."""
    job_id = await arun(conn, call, schema)
    if job_id is None:
        job_id = await arun(conn, Call("job_enqueue_existing", {"key": call.params["key"]}, first_int), schema)
    if job_id is None:
        return await aenqueue(conn, call, schema)
    return job_id


# -- effects (the handlers' idempotency helper) --------------------------------------------


def record_effect_call(
    key: str, job_id: int | None, token: int | None = None, dsn: str = ""
) -> Call[tuple[bool, bool]]:
    """Record effect `key` as done: (lease held, recorded by this call). With a lease `token`,
    nothing is recorded unless job `job_id` still runs under that lease. `dsn` is the
    connection's own (its TCP bounds are the server's for the transaction)."""
    if not key or "\x00" in key:
        raise InvalidInput("an effect key must be a non-empty string without NUL")
    # The server's end of the connection gives up on a silent client as the client's end does
    # (the statement says why); 0, the server's default, where the connection turns
    # keepalives off.
    bounds = server_tcp_params(dsn, {}) or dict.fromkeys(SERVER_TCP_SETTINGS, "0")
    params = {"key": key, "job_id": job_id, "token": token, **bounds}
    return Call("job_effect_record", params, lambda rows: (bool(rows[0][0]), bool(rows[0][1])))


def effect_exists_call(key: str) -> Call[bool]:
    return Call("job_effect_exists", {"key": key}, lambda rows: bool(rows and rows[0][0]))


def notify_ready(conn: psycopg.Connection[Any], schema: str = DEFAULT_SCHEMA) -> None:
    """Wake the workers of `schema` (at the commit of `conn`'s transaction): jobs are ready."""
    run(conn, Call("job_notify_ready", {"channel": statements(schema).channel}, lambda rows: None), schema)


def enqueued(
    conn: psycopg.Connection[Any], job_type: str, payload: Any = None, schema: str = DEFAULT_SCHEMA
) -> list[dict[str, Any]]:
    """The jobs of `job_type` that `conn` sees (its own open transaction's included) whose
    payload holds `payload` (JSON containment), by column name."""
    params = {"type": job_type, "payload": None if payload is None else encode_payload(payload)}
    return run(conn, Call("job_enqueued_matching", params, Rows.dicts), schema)
