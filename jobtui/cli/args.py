"""What the `jobtui` command takes: the DSN, the queue, and argument types whose mistakes read
as one line (exit code 2)."""

from __future__ import annotations

import argparse
import getpass
import json
import os
import socket
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from jobtui.clients.client import Client
from jobtui.kernel import migrate as migrations
from jobtui.kernel.db import connect, describe_dsn, resolve_dsn
from jobtui.kernel.embedded import embedded_dsn
from jobtui.kernel.errors import InvalidInput
from jobtui.kernel.safetext import line, quote, shorten
from jobtui.kernel.views import OpenView, parse_view

Command = Callable[[argparse.Namespace], int]


def default_actor() -> str:
    """Who is acting, for the audit trail: the OS user at this host."""
    try:
        user = getpass.getuser()
    except Exception:  # no user name in this environment (some containers)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


NO_DATABASE = "no database given: set JOBTUI_DSN or pass --dsn; `jobtui demo` runs on an embedded server"
# Options of the whole command that may also come after the subcommand (`jobtui stats --dsn X`).
GLOBAL_OPTIONS = ("--dsn", "--schema", "--actor", "--embedded")


def database_dsn(args: argparse.Namespace) -> str:
    """The DSN from --dsn / JOBTUI_DSN / DATABASE_URL; the embedded server's only when asked
    (--embedded), never by surprise: a console on an empty server of its own would show an
    operator a quiet queue during an incident."""
    dsn = resolve_dsn(args.dsn)
    if dsn is None:
        if not getattr(args, "embedded", False):
            raise InvalidInput(NO_DATABASE)
        dsn = _embedded()
    return dsn


def demo_dsn(args: argparse.Namespace) -> str:
    """The demo's database: --dsn from its own command line, else the embedded server. A DSN
    from the environment is an application's (an app shell sets JOBTUI_DSN or DATABASE_URL):
    the demo makes a schema and jobs, so it does not go there unasked, and says so."""
    if args.dsn:
        return str(args.dsn)
    named = [name for name in ("JOBTUI_DSN", "DATABASE_URL") if os.environ.get(name)]
    if named:
        print(
            f"jobtui demo: ignores {' and '.join(named)}: it runs on the embedded PostgreSQL"
            " (give --dsn to run it on a server of yours)",
            file=sys.stderr,
        )
    return _embedded()


def _embedded() -> str:
    dsn = embedded_dsn()
    print(f"jobtui: using the embedded PostgreSQL ({describe_dsn(dsn)})", file=sys.stderr)
    return dsn


def accept_global_options_anywhere(parser: argparse.ArgumentParser) -> None:
    """Let every subcommand take the global options too. They are added to each subparser
    with a suppressed default, so given after the subcommand they set the value, and left
    out they keep the one given before it (or the global default). A subcommand's own option
    of the same name (`bench --schema`) keeps its meaning."""
    originals = {a.option_strings[0]: a for a in parser._actions if a.option_strings}
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for sub in action.choices.values():
            taken = {o for a in sub._actions for o in a.option_strings}
            for option in GLOBAL_OPTIONS:
                original = originals.get(option)
                if original is None or option in taken:
                    continue
                kwargs: dict[str, Any] = {"dest": original.dest, "default": argparse.SUPPRESS, "help": original.help}
                if isinstance(original, argparse._StoreTrueAction):
                    kwargs["action"] = "store_true"
                sub.add_argument(option, **kwargs)
            accept_global_options_anywhere(sub)


def open_client(args: argparse.Namespace, *, check: bool = True) -> Client:
    client = Client(database_dsn(args), schema=args.schema, pooler=args.pooler)
    if check:
        client.check_schema()
    return client


def parse_payload(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            f"--payload is not valid JSON ({exc.msg} at character {exc.pos}); e.g. '{{\"id\": 1}}'"
        ) from None
    except RecursionError:
        raise InvalidInput("--payload nests too deeply; flatten it") from None


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{quote(text)} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{quote(text)} must be at least 1")
    return value


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{quote(text)} is not a number of seconds") from None
    if not 0.1 <= value <= 86400:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"{quote(text)} must be between 0.1 and 86400 seconds")
    return value


def queue_slots(text: str) -> dict[str, int]:
    """`--queues emails=5,reports=2`: each queue claimed with its own slots."""
    slots: dict[str, int] = {}
    for part in text.split(","):
        name, sep, count = part.strip().partition("=")
        name = name.strip()
        if not part.strip() or not sep or not name:
            raise argparse.ArgumentTypeError(f"{quote(text)}: give NAME=CONCURRENCY pairs, comma-separated")
        if name in slots:
            raise argparse.ArgumentTypeError(f"queue {quote(name)} is given twice")
        slots[name] = positive_int(count.strip())
    return slots


MAX_JOB_ID = 2**63 - 1  # ids are bigint


def job_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{quote(text)} is not a job id (a whole number)") from None
    if not 1 <= value <= MAX_JOB_ID:
        raise argparse.ArgumentTypeError(f"{quote(text)} is not a job id (ids go from 1 to {MAX_JOB_ID})")
    return value


def view_arg(text: str) -> OpenView:
    """`--open workers`, `job:42`, `dead:TYPE`, `queue:NAME` (kernel/views.py)."""
    try:
        return parse_view(text)
    except InvalidInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def port_number(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{quote(text)} is not a port number (1-65535)")
    return value


# What --error matches, for `dead` and `requeue` alike (sql/deadletters.sql, deadletter_matching).
ERROR_MATCH = (
    "a case-insensitive PostgreSQL regular expression, matched against the first line of each job's error"
    " (exception and message, as `jobtui job` shows it) or its fingerprint (numbers masked as <n>,"
    " as `jobtui dead` shows it); never the traceback"
)


def add_error_option(parser: argparse.ArgumentParser, rows: str) -> None:
    """`--error PATTERN`, matched as `dead`, `requeue` and `bulk` match it; `rows` says which
    jobs it picks."""
    parser.add_argument("--error", metavar="PATTERN", help=f"{rows}: {ERROR_MATCH}")


class Parser(argparse.ArgumentParser):
    """Reports a usage mistake in one line, like every other user error (exit code 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"jobtui: error: {one_line(message)} (see `{self.prog} --help`)\n")


def one_line(message: str) -> str:
    """An error message for the terminal: escaped, and cut if it echoes a long input whole."""
    return line(shorten(message))


def add_wait_for_db(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wait-for-db",
        default="60s",
        metavar="DURATION",
        help="at start, how long to wait for PostgreSQL to answer (default 60s; 0 tries once)",
    )


def add_metrics_options(parser: argparse.ArgumentParser) -> None:
    """The metrics port of a worker or a scheduler: /metrics, /healthz and /readyz."""
    parser.add_argument(
        "--metrics-port", type=port_number, help="serve Prometheus /metrics and the probes /healthz, /readyz here"
    )
    parser.add_argument(
        "--metrics-addr",
        metavar="ADDR",
        help="the address to listen on, e.g. 127.0.0.1 for this host only (default: every address)",
    )
    parser.add_argument(
        "--metrics-token-file",
        metavar="PATH",
        help="/metrics answers only requests with `Authorization: Bearer TOKEN`, TOKEN read from PATH"
        " (the probes stay open)",
    )


# The commands that change the database, by the words that name them, each with the options
# under which it only looks (counts, prints SQL). `main` refuses them under --read-only, before
# anything connects: this table is the one place that decides it. Every other command reads
# the database, or (`jobtui user`) edits the users file of `jobtui serve`, not the database;
# the console and `serve` make their consoles read-only. tests/integration/test_read_only.py
# holds every command of the parser to these two tables.
CHANGES: dict[tuple[str, ...], tuple[str, ...]] = {
    ("migrate",): ("check", "dry_run"),
    ("enqueue",): (),
    ("worker",): (),
    ("scheduler",): (),
    ("schedule", "add"): (),
    ("schedule", "pause"): (),
    ("schedule", "resume"): (),
    ("schedule", "remove"): (),
    ("schedule", "run-now"): (),
    ("requeue",): ("dry_run",),
    ("kill-lease",): (),
    ("cancel",): (),
    ("queue", "pause"): (),
    ("queue", "resume"): (),
    ("queue", "rate"): (),
    ("queue", "limit"): (),
    ("type", "pause"): (),
    ("type", "resume"): (),
    ("type", "rate"): (),
    ("workers", "quiet"): (),
    ("workers", "resume"): (),
    ("workers", "stop"): (),
    ("index",): (),
    ("bulk", "requeue"): ("dry_run",),
    ("bulk", "discard"): ("dry_run",),
    ("bulk", "cancel"): ("dry_run",),
    ("uninstall",): (),
    ("bench",): (),
    ("demo",): (),
}
READS = {
    (),  # the console
    ("serve",),
    ("stats",),
    ("dead",),
    ("jobs",),
    ("job",),
    ("audit",),
    ("metrics",),
    ("health",),
    ("queue", "list"),
    ("workers",),
    ("why",),
    ("schedule", "list"),
    ("user", "add"),
    ("user", "remove"),
    ("user", "list"),
}


def name_commands(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> None:
    """Give every parser's namespace `command_words`, the words of the command it parses
    (`("queue", "rate")`): a subcommand's defaults replace its parent's."""
    parser.set_defaults(command_words=words)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                name_commands(sub, (*words, name))


def refuse_changes_when_read_only(args: argparse.Namespace) -> None:
    """Under --read-only, a command that changes the database stops here, in one line."""
    words: tuple[str, ...] = getattr(args, "command_words", ())
    looks = CHANGES.get(words)
    if not getattr(args, "read_only", False) or looks is None or any(getattr(args, o, False) for o in looks):
        return
    instead = " or ".join(f"--{o.replace('_', '-')}" for o in looks)
    raise InvalidInput(
        f"`jobtui {' '.join(words)}` changes the database, which --read-only forbids: run it without --read-only"
        + (f", or with {instead} to change nothing" if instead else "")
    )


def check_migrated(dsn: str, args: argparse.Namespace, **connect_options: Any) -> None:
    """Refuse, in one line, a schema that is not migrated to this release."""
    with connect(dsn, pooler=args.pooler, **connect_options) as conn:
        migrations.check(conn, args.schema)


def with_dsn(fn: Callable[[argparse.Namespace, str], int]) -> Command:
    def command(args: argparse.Namespace) -> int:
        dsn = database_dsn(args)
        check_migrated(dsn, args)
        return fn(args, dsn)

    return command


def with_client(fn: Callable[[argparse.Namespace, Client], int]) -> Command:
    def command(args: argparse.Namespace) -> int:
        with open_client(args) as client:
            return fn(args, client)

    return command
