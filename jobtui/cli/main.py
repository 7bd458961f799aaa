"""The `jobtui` command: its top-level options, and `main`. User mistakes print one line on
stderr and exit with 2.

Each command group owns its parsers and handlers in a module of its own (`ops`, `queues`,
`search`, `bulk`, `serve`, `admin`, `run`, `job`, `schedules`, `workers`, `why`, `demo`, `bench`); this module
adds them in the order `jobtui --help` lists them. Job data, and user input echoed in errors,
is printed escaped (`safetext`); `--json` prints it exact. The argument types live in `args`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import psycopg

from jobtui.cli import admin, bench, bulk, demo, job, ops, queues, run, schedules, search, serve, why, workers
from jobtui.cli.args import (
    Command,
    Parser,
    accept_global_options_anywhere,
    default_actor,
    name_commands,
    one_line,
    positive_int,
    refuse_changes_when_read_only,
    view_arg,
)
from jobtui.kernel.db import POOLERS, pooler_mode
from jobtui.kernel.domain import DEFAULT_SCHEMA
from jobtui.kernel.errors import JobtuiError, first_line
from jobtui.kernel.safetext import quote
from jobtui.kernel.version import installed_version


def package_version() -> str:
    """The installed distribution's version (what `pip` installed)."""
    found = installed_version()
    return "unknown (not installed)" if found == "unknown" else found


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="jobtui", description="PostgreSQL job queue and operator console")
    parser.add_argument("--dsn", help="PostgreSQL DSN (default: JOBTUI_DSN, else DATABASE_URL)")
    parser.add_argument(
        "--embedded", action="store_true", help="with no DSN, use the embedded PostgreSQL (as `jobtui demo` does)"
    )
    parser.add_argument(
        "--schema", default=DEFAULT_SCHEMA, help=f"schema holding jobtui's tables (default: {DEFAULT_SCHEMA})"
    )
    parser.add_argument("--actor", default=default_actor(), help="who acts, for the audit log (default user@host)")
    parser.add_argument("--version", action="version", version=f"jobtui {package_version()}")
    parser.add_argument(
        "--pooler",
        choices=POOLERS,
        # JOBTUI_POOLER is read here only; main() checks it and every command is given the value.
        default=os.environ.get("JOBTUI_POOLER") or "none",
        help="transaction: the DSN goes through PgBouncer with pool_mode = transaction, so jobtui keeps no"
        " session state (default: JOBTUI_POOLER, else none)",
    )
    parser.add_argument(
        "--read-only",
        action="store_true",
        help="the console (and `serve`'s consoles) hide and refuse every action; a command that changes the"
        " database refuses to run",
    )
    console = parser.add_argument_group("console (jobtui with no command)")
    console.add_argument("--work", metavar="M:ATTR", help="run a worker (and scheduler) inside the console")
    console.add_argument(
        "--concurrency", type=positive_int, default=4, help="embedded worker's concurrency (default 4)"
    )
    console.add_argument(
        "--executor",
        choices=("thread", "process"),
        default="thread",
        help="embedded worker's sync handlers: a thread each, or child processes it can stop (default thread)",
    )
    console.add_argument(
        "--open",
        metavar="VIEW",
        type=view_arg,
        help="start on a view: workers, why (or any pane: running, dead, queues, ...), job:ID, dead:TYPE or queue:NAME",
    )
    console.add_argument("--warn-age", default="1m", help="oldest ready age that turns amber (default 1m)")
    console.add_argument("--crit-age", default="5m", help="oldest ready age that turns red (default 5m)")
    console.add_argument("--warn-dead", type=int, default=1, help="dead count that turns amber (default 1)")
    console.add_argument("--crit-dead", type=int, default=100, help="dead count that turns red (default 100)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    admin.add_migrate_parser(sub)
    job.add_enqueue_parser(sub)
    search.add_jobs_parser(sub)
    run.add_parsers(sub)
    schedules.add_parsers(sub)
    ops.add_parsers(sub)
    queues.add_parsers(sub)
    workers.add_parsers(sub)
    why.add_parsers(sub)
    search.add_index_parser(sub)
    bulk.add_parsers(sub)
    serve.add_parsers(sub)
    admin.add_parsers(sub)
    bench.add_parsers(sub)
    demo.add_parsers(sub)
    job.add_job_parser(sub)
    accept_global_options_anywhere(parser)
    name_commands(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    for arg in argv:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:  # bytes that are not UTF-8, decoded by Python as surrogates
            print(f"jobtui: error: argument {quote(arg)} is not valid UTF-8 text; check its encoding", file=sys.stderr)
            return 2
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Command = getattr(args, "func", None) or run.cmd_console
    try:
        refuse_changes_when_read_only(args)
        # A bad JOBTUI_POOLER is one line, before anything connects.
        args.pooler = pooler_mode(args.pooler)
        return func(args)
    except JobtuiError as exc:
        print(f"jobtui: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except psycopg.errors.InsufficientPrivilege as exc:
        print(
            f"jobtui: error: {one_line(first_line(exc))}: the database role lacks a privilege this command needs "
            "(see Privileges in jobtui's README)",
            file=sys.stderr,
        )
        return 2
    except psycopg.Error as exc:
        print(f"jobtui: database error: {one_line(first_line(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
