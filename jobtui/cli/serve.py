"""`jobtui serve` (the console in a browser) and `jobtui user add|remove|list` (who may sign in).

Both need the `serve` extra (aiohttp, argon2-cffi, textual-serve), imported only here.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import ipaddress
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

from jobtui.cli.args import database_dsn, port_number, positive_int
from jobtui.core.privileges import (
    READ_ONLY_ROLE,
    VIEWER_NEEDS,
    missing_privileges_call,
    role_changes_call,
    shown,
)
from jobtui.kernel import migrate as migrations
from jobtui.kernel.db import check_dsn, connect, describe_dsn, run
from jobtui.kernel.durations import parse_duration
from jobtui.kernel.errors import DatabaseUnavailable, InvalidInput
from jobtui.kernel.safetext import quote

EXTRA = "`jobtui serve` and `jobtui user` need the serve extra: pip install 'jobtui[serve]'"
VIEWER_DSN_ENV = "JOBTUI_VIEWER_DSN"
ORIGIN = re.compile(r"https?://[A-Za-z0-9.\-]+(:\d{1,5})?|https?://\[[0-9A-Fa-f:.]+\](:\d{1,5})?")


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="the console in a browser, behind a sign-in (users from `jobtui user add`)",
        description="Serve the console over HTTP and WebSocket: each browser tab gets a console of its own,"
        " as its signed-in user (read-only unless an operator). Takes the console's options (--read-only,"
        " --warn-age...) given before `serve`.",
    )
    p.add_argument("--addr", default="127.0.0.1", help="listen address (default 127.0.0.1, this machine only)")
    p.add_argument("--port", type=_port, default=8080, help="listen port (default 8080; 0 picks a free one)")
    p.add_argument("--users", help="the users file (default: JOBTUI_USERS, else ~/.config/jobtui/users)")
    p.add_argument("--cert", help="TLS certificate chain (PEM); with --key, serve HTTPS")
    p.add_argument("--key", help="TLS private key (PEM)")
    p.add_argument(
        "--insecure-http",
        action="store_true",
        help="serve plain HTTP on an address other machines reach (only behind a TLS proxy on a private network)",
    )
    p.add_argument(
        "--trusted-proxy",
        metavar="ADDRS",
        help="comma-separated addresses or networks of reverse proxies whose X-Forwarded-For and"
        " X-Forwarded-Proto are believed (default: none)",
    )
    p.add_argument(
        "--origin",
        help="the address users open, as https://host[:port], when it is not the Host header the server sees",
    )
    p.add_argument(
        "--max-sessions", type=positive_int, default=10, help="consoles (browser tabs) open at once (default 10)"
    )
    p.add_argument("--idle-timeout", default="15m", help="sign out after this long without a key (default 15m)")
    p.add_argument(
        "--read-only",
        action="store_true",
        default=argparse.SUPPRESS,  # or `jobtui --read-only serve`
        help="every console read-only, operators' too",
    )
    p.add_argument(
        "--viewer-dsn",
        metavar="DSN",
        default=os.environ.get(VIEWER_DSN_ENV) or None,
        help="the DSN viewers' consoles connect with: a role with the read grants of docs/grants.sql only"
        f" (default: {VIEWER_DSN_ENV}; without it, serve's own DSN when its role can change nothing)",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--log-format", choices=("text", "json"), help="log lines as escaped text or JSON")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("user", help="who may sign in to `jobtui serve`")
    usub = p.add_subparsers(dest="user_action", metavar="ACTION", required=True)
    a = usub.add_parser("add", help="add a user; the password is asked (or read from a pipe, one line)")
    a.add_argument("name")
    a.add_argument("--operator", action="store_true", help="may change the queue (default: a read-only console)")
    a.add_argument("--replace", action="store_true", help="the user exists: set a new password and role")
    a = usub.add_parser("remove", help="remove a user (signed out within seconds)")
    a.add_argument("name")
    usub.add_parser("list", help="list the users and their roles")
    for action in usub.choices.values():
        action.add_argument("--users", help="the users file (default: JOBTUI_USERS, else ~/.config/jobtui/users)")
    p.set_defaults(func=cmd_user)


def _port(text: str) -> int:
    return 0 if text.strip() == "0" else port_number(text)


def _users_file(args: argparse.Namespace) -> Any:
    try:
        from jobtui.web.users import UsersFile, default_path
    except ImportError:
        raise InvalidInput(EXTRA) from None
    return UsersFile(Path(args.users) if args.users else default_path())


def cmd_user(args: argparse.Namespace) -> int:
    users = _users_file(args)
    from jobtui.web.users import OPERATOR, VIEWER, check_name

    if args.user_action == "list":
        for user in users.load().values():
            print(f"{user.name}\t{user.role}")
        return 0
    if args.user_action == "remove":
        users.remove(args.name)
        print(f"user {quote(args.name)} removed from {users.path}")
        return 0
    check_name(args.name)
    password = _read_password(args.name)
    role = OPERATOR if args.operator else VIEWER
    new = users.add(args.name, password, role=role, replace=args.replace)
    print(f"user {quote(args.name)} {'added' if new else 'replaced'} as {role} in {users.path}")
    return 0


def _read_password(name: str) -> str:
    """Asked twice on a terminal, without echo; else the first line of standard input."""
    if sys.stdin.isatty():
        first = getpass.getpass(f"password for {name}: ")
        if getpass.getpass("again: ") != first:
            raise InvalidInput("the two passwords differ; nothing was changed")
        return first
    text = sys.stdin.readline()
    return text[:-1] if text.endswith("\n") else text


def is_loopback(addr: str) -> bool:
    if addr.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may name any interface


def cmd_serve(args: argparse.Namespace) -> int:
    users = _users_file(args)
    try:
        from jobtui.web.server import ServeConfig, serve, tls_context
    except ImportError:
        raise InvalidInput(EXTRA) from None
    from jobtui.cli.run import setup_logging

    if args.work:
        raise InvalidInput("--work runs a worker inside a console; `jobtui serve` does not: run `jobtui worker`")
    users.check_private()
    if not users.load():
        raise InvalidInput(
            f"no users in {users.path}: nobody could sign in. Add one with `jobtui user add NAME --operator"
            f" --users {users.path}`"
        )
    if (args.cert is None) != (args.key is None):
        raise InvalidInput("give --cert and --key together (the certificate chain and its private key, PEM)")
    context = None
    if args.cert is not None:
        try:
            context = tls_context(args.cert, args.key)
        except (OSError, ValueError) as exc:
            raise InvalidInput(f"cannot load --cert {args.cert} and --key {args.key}: {exc}") from None
    if context is None and not args.insecure_http and not is_loopback(args.addr):
        raise InvalidInput(
            f"refusing to serve plain HTTP on {args.addr}, which other machines reach: passwords and sessions"
            " would cross the network in clear. Give --cert and --key, or put a TLS proxy in front and give"
            " --insecure-http"
        )
    proxies = _networks(args.trusted_proxy)
    origin = None
    if args.origin is not None:
        origin = args.origin.rstrip("/").lower()
        if not ORIGIN.fullmatch(origin):
            raise InvalidInput(f"--origin {quote(args.origin)}: give it as https://host or https://host:port")
    idle = parse_duration(args.idle_timeout)
    if idle <= 0:
        raise InvalidInput("--idle-timeout must be more than 0, e.g. 15m")
    for option in (args.warn_age, args.crit_age):
        parse_duration(option)
    dsn = database_dsn(args)
    with connect(dsn, autocommit=True, pooler=args.pooler) as conn:
        migrations.check(conn, args.schema)
        own_changes = run(conn, role_changes_call(args.schema), args.schema)
    viewers = sorted(name for name, user in users.load().items() if not user.operator or args.read_only)
    viewer_dsn = _viewer_dsn(args, dsn, own_changes, viewers)
    # Each console is a `jobtui` process of its own: it is told the pooler as the others are.
    options = ["--schema", args.schema, "--pooler", args.pooler]
    options += ["--warn-age", args.warn_age, "--crit-age", args.crit_age]
    options += ["--warn-dead", str(args.warn_dead), "--crit-dead", str(args.crit_dead)]
    config = ServeConfig(
        dsn=dsn,
        viewer_dsn=viewer_dsn,
        users=users,
        console_options=options,
        read_only=args.read_only,
        tls=context is not None,
        trusted_proxies=proxies,
        origin=origin,
        max_sessions=args.max_sessions,
        idle_timeout=idle,
        schema=args.schema,
        pooler=args.pooler,
    )
    setup_logging(args.verbose, args.log_format)
    logging.getLogger("aiohttp").setLevel(logging.WARNING)
    logging.getLogger("jobtui.serve").info(
        "%d user(s), at most %d console(s) at once, %s, sign-out after %gs idle",
        len(users.load()),
        config.max_sessions,
        "every console read-only" if config.read_only else "read-only for viewers",
        config.idle_timeout,
    )

    def ready(url: str) -> None:
        print(f"jobtui serve: listening on {url} (users in {users.path})", file=sys.stderr, flush=True)

    asyncio.run(serve(config, args.addr, args.port, context, ready))
    return 0


def _viewer_dsn(args: argparse.Namespace, dsn: str, own_changes: list[str], viewers: list[str]) -> str | None:
    """The DSN of viewers' consoles: --viewer-dsn once its role is found to read the schema and
    change nothing in it; else serve's own, if its role changes nothing; else None, which
    is refused when the users file has viewers (or every console is read-only)."""
    create = READ_ONLY_ROLE.format(schema=args.schema)
    if args.viewer_dsn is None:
        if not own_changes:
            return dsn
        if not viewers:
            return None  # operators only: a viewer added later is refused their console
        who = "every console (--read-only)" if args.read_only else f"viewers ({', '.join(viewers)})"
        raise InvalidInput(
            f"{who} must connect as a role that can change nothing, and serve's role holds"
            f" {shown(own_changes, 3)}: create a read-only role with `{create}` and give its DSN"
            f" as --viewer-dsn or {VIEWER_DSN_ENV}"
        )
    given = check_dsn(args.viewer_dsn)
    try:
        with connect(given, autocommit=True, pooler=args.pooler) as conn:
            migrations.check(conn, args.schema)
            missing = run(conn, missing_privileges_call(args.schema, VIEWER_NEEDS), args.schema)
            changes = run(conn, role_changes_call(args.schema), args.schema)
    except DatabaseUnavailable as exc:
        raise InvalidInput(
            f"--viewer-dsn: {exc}. Viewers' consoles need a role with the read grants of docs/grants.sql: `{create}`"
        ) from None
    if changes:
        raise InvalidInput(
            f"--viewer-dsn {describe_dsn(given)}: its role holds {shown(changes, 3)}, and a viewer's"
            f" console must change nothing: give it the read-only role of docs/grants.sql (`{create}`)"
        )
    if missing:
        raise InvalidInput(
            f"--viewer-dsn {describe_dsn(given)}: its role lacks {shown(missing, 3)}, which a viewer's console"
            f" reads: grant what docs/grants.sql gives the read-only role (`{create}`)"
        )
    return given


def _networks(text: str | None) -> tuple[Any, ...]:
    if not text:
        return ()
    nets = []
    for part in text.split(","):
        try:
            nets.append(ipaddress.ip_network(part.strip(), strict=False))
        except ValueError:
            raise InvalidInput(
                f"--trusted-proxy {quote(part.strip())} is not an address or network, e.g. 127.0.0.1 or 10.0.0.0/24"
            ) from None
    return tuple(nets)
