"""`jobtui why [--queue Q] [--type T] [--json]`: why the backlog grows. For every queue and job
type with jobs waiting, the causes that hold now, most likely first, each with its evidence
and the fix (reads/diagnosis.py); a queue or type that nothing holds says so, with its
forecast; and what it cannot see.

Its exit code is for scripts and alerts: 0 nothing waits with a cause, 1 something does, 2 bad
input, 3 the database did not answer. Names from the database are printed escaped; `--json`
prints them exact (docs/operations.md, "Why is the backlog growing").
"""

from __future__ import annotations

import argparse
import threading
from dataclasses import dataclass
from typing import Any

import psycopg

from jobtui.cli.args import check_migrated, database_dsn
from jobtui.cli.output import print_json
from jobtui.kernel.db import connect, first_line, pooler_mode, run
from jobtui.kernel.durations import parse_duration
from jobtui.kernel.errors import DatabaseUnavailable, InvalidInput
from jobtui.kernel.safetext import line, quote
from jobtui.reads import causes
from jobtui.reads.console import session_call
from jobtui.reads.diagnosis import Diagnosis, Subject, diagnose, text_of, unanswered
from jobtui.reads.fleet import read_fleet
from jobtui.reads.metrics import QueueLocked, Snapshot
from jobtui.reads.overview import QueueLine, read_with_snapshot
from jobtui.reads.scene import Scene
from jobtui.reads.timers import watched
from jobtui.reads.why import read_facts

# Exit codes.
NOTHING_HELD, HELD, BAD_INPUT, NOT_ANSWERING = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class Read:
    """What one `jobtui why` read: the diagnosis, and the names it knows."""

    diagnosis: Diagnosis
    known: dict[str, set[str]]


def known_names(snap: Snapshot, lines: list[QueueLine], scene: Scene) -> dict[str, set[str]]:
    """The queues and types anything names: a job of any status, a setting, a worker."""
    queues = {q.name for q in lines if q.kind == "queue"} | {w.queue for w in scene.facts.waiting}
    types = {q.name for q in lines if q.kind == "type"} | {t.type for t in snap.by_type}
    types |= {t for of_status in snap.attempts_by_type.values() for t in of_status}
    for p in scene.fleet.processes:
        queues |= set(p.queues)
        types |= set(p.types)
    return {"queue": queues, "type": types}


def read(dsn: str, schema: str, pooler: str | None, timeout: float) -> Read:
    """Everything the diagnosis needs, on one connection whose statements time out."""
    with watched(connect(dsn, autocommit=True, pooler=pooler, connect_timeout=max(1, round(timeout))), schema) as conn:
        local = pooler_mode(pooler) == "transaction"
        run(conn, session_call(timeout, local=local), schema)
        view, snap = read_with_snapshot(conn, schema)
        lines = view.lines
        scene = Scene.of(snap, lines, read_fleet(conn, schema), read_facts(conn, schema))
    return Read(diagnose(scene), known_names(snap, lines, scene))


def read_in_time(dsn: str, schema: str, pooler: str | None, timeout: float) -> Read:
    """`read`, given up after `timeout` seconds and a grace (a server that froze answers no
    statement timeout): the database then did not answer."""
    result: list[Read] = []
    failed: list[BaseException] = []

    def reading() -> None:
        try:
            result.append(read(dsn, schema, pooler, timeout))
        except BaseException as exc:  # handed to the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=reading, name="jobtui-why", daemon=True)
    thread.start()
    thread.join(timeout + 3.0)
    if failed:
        raise failed[0]
    if not result:
        raise DatabaseUnavailable(f"the database did not answer within {timeout + 3.0:g}s")
    return result[0]


def chosen(d: Diagnosis, known: dict[str, set[str]], args: argparse.Namespace) -> tuple[Diagnosis, list[str]]:
    """The subjects --queue and --type name (both: either), and a line for each named one
    with nothing waiting. InvalidInput for a name nothing knows."""
    asked = [("queue", args.queue), ("type", args.type)]
    asked = [(kind, name) for kind, name in asked if name is not None]
    if not asked:
        return d, []
    quiet = []
    for kind, name in asked:
        if name not in known[kind]:
            raise InvalidInput(
                f"no {kind} {quote(name)} is known: no job, worker or setting names it (see `jobtui queue list`)"
            )
        if not any((s.kind, s.name) == (kind, name) for s in d.subjects):
            quiet.append(f"{kind} {name}: nothing waits")
    subjects: list[Subject] = [s for s in d.subjects if (s.kind, s.name) in asked]
    return Diagnosis(d.taken_at, subjects, d.general, d.cannot_see), quiet


def cmd_why(args: argparse.Namespace) -> int:
    dsn = database_dsn(args)
    timeout = parse_duration(args.timeout)
    if not 0 < timeout <= 600:
        raise InvalidInput(f"--timeout must be more than 0 and at most 10m, got {args.timeout}")
    quiet: list[str] = []
    try:
        check_migrated(dsn, args, connect_timeout=max(1, round(timeout)))
        got = read_in_time(dsn, args.schema, args.pooler, timeout)
        d, quiet = chosen(got.diagnosis, got.known, args)
        code = HELD if d.waiting else NOTHING_HELD
    except QueueLocked as exc:
        d, code = Diagnosis(None, [], [causes.locked_out(str(exc))]), HELD
    except (psycopg.OperationalError, DatabaseUnavailable) as exc:
        d, code = unanswered(first_line(exc)), NOT_ANSWERING
    if args.json:
        print_json({**d.to_json(), "nothing_waits": quiet})
        return code
    shown = quiet + list(text_of(d))
    if not shown:
        shown = ["nothing waits: no queue or type has ready jobs"]
    for text in shown:
        print(line(text))
    return code


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "why",
        help="why the backlog grows: for each queue and type with jobs waiting, what holds them, the evidence and"
        " the fix; exit code 1 when something waits with a cause",
    )
    p.add_argument("--queue", help="only this queue")
    p.add_argument("--type", help="only this job type")
    p.add_argument("--json", action="store_true", help="the diagnosis as JSON (docs/operations.md lists its fields)")
    p.add_argument("--timeout", default="10s", help="how long to wait for the database (default 10s)")
    p.set_defaults(func=cmd_why)
