"""The administrator's `jobtui` commands: `migrate` (with `--check` and `--dry-run`), `health`
for scripts and orchestrators, and `uninstall`.

Exit codes: 0 done (or healthy, or nothing pending), 1 not (unhealthy, migrations pending,
not confirmed, a role kept), 2 a mistake in what was asked.
"""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request
from typing import Any

import psycopg

from jobtui.cli.args import database_dsn, port_number, positive_seconds
from jobtui.kernel import migrate as migrations
from jobtui.kernel.db import connect, describe_dsn, run
from jobtui.kernel.durations import parse_duration
from jobtui.kernel.errors import DatabaseUnavailable, InvalidInput
from jobtui.kernel.safetext import line
from jobtui.kernel.server import read_only_call
from jobtui.service.endpoints import LIVE_PATH, READY_PATH


def add_migrate_parser(sub: Any) -> None:
    p = sub.add_parser("migrate", help="create or upgrade the schema (--check, --dry-run: change nothing)")
    what = p.add_mutually_exclusive_group()
    what.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when migrations are pending (or an index build was interrupted), 0 when none are",
    )
    what.add_argument("--dry-run", action="store_true", help="print the SQL `jobtui migrate` would run, run nothing")
    p.add_argument(
        "--lock-timeout",
        default="5s",
        metavar="DURATION",
        help="wait at most this long for a table's lock, then let the claims queued behind it go on and try"
        f" again, {migrations.LOCK_TRIES} times in all (default 5s; 0: wait as long as it takes)",
    )
    p.set_defaults(func=cmd_migrate)


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "health",
        help="exit 0 when ready (a worker's or scheduler's /readyz with --port, else the database), 1 when not",
    )
    p.add_argument("--port", type=port_number, help="ask the worker or scheduler serving --metrics-port PORT")
    p.add_argument("--addr", default="127.0.0.1", help="where that process listens (default 127.0.0.1)")
    p.add_argument("--live", action="store_true", help="ask /healthz (alive) instead of /readyz (ready)")
    p.add_argument("--timeout", type=positive_seconds, default=5.0, help="seconds to wait for the answer (default 5)")
    p.set_defaults(func=cmd_health)

    p = sub.add_parser("uninstall", help="drop the schema and the roles docs/grants.sql created for it (asks first)")
    p.add_argument("--yes", action="store_true", help="do not ask (for scripts): drop what it shows")
    p.set_defaults(func=cmd_uninstall)


def _say_waited(why: str) -> None:
    print(f"jobtui migrate: {why}", file=sys.stderr, flush=True)


def _say_built(what: str) -> None:
    print(what, flush=True)


def cmd_migrate(args: argparse.Namespace) -> int:
    lock_timeout = parse_duration(args.lock_timeout)
    dsn = database_dsn(args)
    with connect(dsn, autocommit=True, pooler=args.pooler) as conn:
        if not (args.check or args.dry_run):
            applied = migrations.migrate(
                conn, args.schema, lock_timeout=lock_timeout, waited=_say_waited, built=_say_built
            )
            for m in applied:
                print(f"applied {m.version:04d}_{m.name}")
            print(f"schema {args.schema!r} is at version {migrations.code_version()}")
            return 0
        version, todo = migrations.pending(conn, args.schema)
        invalid = migrations.interrupted(conn, args.schema)
        in_transaction = {m.version for m in todo if m.online and migrations.small(conn, args.schema, m)}
    known = migrations.code_version()
    found = "missing" if version is None else f"at version {version}"
    if version is not None and version > known:
        print(f"schema {args.schema!r} is at version {version}, newer than this jobtui's {known}: nothing to apply")
        return 0
    if args.dry_run:
        print(f"-- jobtui migrate on {describe_dsn(dsn)}: schema {args.schema!r} is {found}")
        print(migrations.dry_run_sql(args.schema, version, todo, invalid, in_transaction), end="")
        return 0
    for build in invalid:
        print(f"index {build.name} is invalid (a build was interrupted): `jobtui migrate` drops it and builds it again")
    if not todo:
        print(f"schema {args.schema!r} is at version {version}: no migration pending")
        return 1 if invalid else 0
    names = ", ".join(f"{m.version:04d}_{m.name}" for m in todo)
    print(f"schema {args.schema!r} is {found}; this jobtui applies {names}: run `jobtui migrate`")
    return 1


def cmd_health(args: argparse.Namespace) -> int:
    if args.port is None:
        return _database_health(args)
    path = LIVE_PATH if args.live else READY_PATH
    host = f"[{args.addr}]" if ":" in args.addr else args.addr
    url = f"http://{host}:{args.port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as response:
            print(line(response.read(500).decode("utf-8", "replace").strip()))
            return 0
    except urllib.error.HTTPError as exc:
        print(line(exc.read(500).decode("utf-8", "replace").strip() or f"{path} answered {exc.code}"))
        return 1
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        print(f"not {'alive' if args.live else 'ready'}: nothing answers on {url} ({line(str(reason))})")
        return 1


def _database_health(args: argparse.Namespace) -> int:
    """Without --port: whether the database answers within --timeout, writable, with every
    migration of this code applied (what a worker needs to start)."""
    dsn = database_dsn(args)
    try:
        with connect(dsn, autocommit=True, connect_timeout=max(1, round(args.timeout)), pooler=args.pooler) as conn:
            version, todo = migrations.pending(conn, args.schema)
            read_only = run(conn, read_only_call(), args.schema)
    except DatabaseUnavailable as exc:
        print(f"not ready: {line(str(exc))}")
        return 1
    if version is None or todo:
        # The worker's own test (migrate.check): every migration of this code applied.
        print(f"not ready: {migrations.lacking(args.schema, version, todo)}: run `jobtui migrate`")
        return 1
    if read_only:
        print("not ready: the server is read-only (a standby?): workers need the primary")
        return 1
    print(f"ready: {describe_dsn(dsn)} answers; schema {args.schema!r} is at version {version}")
    return 0


def cmd_uninstall(args: argparse.Namespace) -> int:
    from jobtui.core import uninstall

    dsn = database_dsn(args)
    with connect(dsn, autocommit=True, pooler=args.pooler) as conn:
        contents = uninstall.inspect(conn, args.schema)
        if contents.read_only:
            raise InvalidInput("the server is read-only (a standby?): run `jobtui uninstall` on the primary")
        if contents.live_leases:
            workers = ", ".join(contents.workers[:5]) + (" ..." if len(contents.workers) > 5 else "")
            raise InvalidInput(
                f"{contents.live_leases} job(s) run under live leases (workers {workers}): stop every worker first"
            )
        for text in uninstall.describe(contents):
            print(line(text))
        if not args.yes:
            if not sys.stdin.isatty():
                raise InvalidInput("uninstall asks first: run it in a terminal, or add --yes to drop what it shows")
            answer = input(f"Type the schema's name ({args.schema}) to drop all of this: ")
            if answer.strip() != args.schema:
                print("not confirmed: nothing dropped")
                return 1
        try:
            dropped = uninstall.drop(conn, contents)
        except psycopg.errors.LockNotAvailable:
            print(
                f"jobtui: schema {args.schema!r} is in use (a worker, scheduler, console or migration holds its"
                " tables): nothing dropped; stop them and run it again",
                file=sys.stderr,
            )
            return 1
    print(f"dropped schema {args.schema!r}" + "".join(f", role {r!r}" for r in dropped.roles))
    for role, why in dropped.kept:
        print(line(f"kept role {role!r}: {why}"), file=sys.stderr)
    return 1 if dropped.kept else 0
