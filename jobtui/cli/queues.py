"""`jobtui queue list|pause|resume|limit|rate` and `jobtui type pause|resume|rate`: the
fleet-wide levers of jobtui/core/queues.py from the shell. Each change is audited, and refused
with `--read-only`; names are printed escaped."""

from __future__ import annotations

import argparse
from typing import Any

from jobtui.cli.args import with_dsn
from jobtui.cli.ops import queue_json, queue_table, wide_console
from jobtui.cli.output import print_json
from jobtui.core import queues
from jobtui.kernel.db import connect, run
from jobtui.kernel.durations import parse_duration
from jobtui.kernel.errors import InvalidInput
from jobtui.kernel.rates import parse_rate, rate_text
from jobtui.kernel.safetext import line, quote
from jobtui.reads.flows import line_forecasts, recent_call
from jobtui.reads.overview import overview
from jobtui.reads.timers import watched


def limit_value(text: str) -> int | None:
    """`none` clears the limit; otherwise a whole number of jobs running at once."""
    if text.strip().lower() in ("none", "off"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{quote(text)} is not a number of jobs (or none)") from None
    if not 0 <= value <= queues.MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"{quote(text)} must be between 0 and {queues.MAX_LIMIT}")
    return value


def cmd_list(args: argparse.Namespace, dsn: str) -> int:
    with watched(connect(dsn, autocommit=True, pooler=args.pooler), args.schema) as conn:
        view = overview(conn, args.schema)
        forecasts = line_forecasts(view.lines, run(conn, recent_call(), args.schema))
    if args.json:
        print_json(queue_json(view.lines, forecasts))
        return 0
    console = wide_console()
    console.print(queue_table(view.lines, forecasts))
    if not view.counted:
        console.print(f"~ estimated: too many ready jobs to count on every read; from {view.source}")
    return 0


def cmd_pause(args: argparse.Namespace, dsn: str) -> int:
    with connect(dsn, pooler=args.pooler) as conn:
        changed = queues.pause(conn, args.kind, args.name, actor=args.actor, schema=args.schema)
    said = "paused on every worker (running jobs finish)" if changed else "was already paused"
    print(f"{args.kind} {quote(args.name)} {said}")
    return 0


def rate_value(text: str) -> float | None:
    """`20/s`, `1200/min`, `30/h`, or none."""
    try:
        return parse_rate(text)
    except InvalidInput as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("bad rate ")) from None


def cmd_resume(args: argparse.Namespace, dsn: str) -> int:
    ramp = None if args.ramp is None else parse_duration(args.ramp)
    if ramp is not None and ramp <= 0:
        raise InvalidInput(f"--ramp {quote(args.ramp)}: give how long the rate rises, e.g. 60s")
    with connect(dsn, pooler=args.pooler) as conn:
        changed = queues.resume(conn, args.kind, args.name, actor=args.actor, ramp=ramp, schema=args.schema)
    said = "resumed" if changed else "was not paused"
    if changed and ramp is not None:
        said += f", its rate rising over {args.ramp}"
    print(f"{args.kind} {quote(args.name)} {said}")
    return 0


def cmd_rate(args: argparse.Namespace, dsn: str) -> int:
    with connect(dsn, pooler=args.pooler) as conn:
        change = queues.set_rate(conn, args.kind, args.name, args.rate, actor=args.actor, schema=args.schema)
    now = "none" if args.rate is None else f"{rate_text(args.rate)} across every worker"
    print(line(f"{args.kind} {quote(args.name)} rate: {now} (was {rate_text(change.was)})"))
    return 0


def cmd_limit(args: argparse.Namespace, dsn: str) -> int:
    with connect(dsn, pooler=args.pooler) as conn:
        change = queues.set_limit(conn, args.name, args.limit, actor=args.actor, schema=args.schema)
    was = "none" if change.was is None else str(change.was)
    now = "none" if args.limit is None else f"{args.limit} running at once across every worker"
    print(line(f"queue {quote(args.name)} limit: {now} (was {was})"))
    return 0


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("queue", help="list queues; pause, resume or limit one across every worker")
    qsub = p.add_subparsers(dest="action", required=True)
    a = qsub.add_parser("list", help="each queue and job type: ready, running, limit, paused, oldest age")
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=with_dsn(cmd_list))
    for kind in queues.KINDS:
        target = p if kind == "queue" else sub.add_parser("type", help="pause or resume a job type everywhere")
        tsub = qsub if kind == "queue" else target.add_subparsers(dest="action", required=True)
        a = tsub.add_parser("pause", help=f"no worker claims this {kind}'s jobs until resumed; running ones finish")
        a.add_argument("name")
        a.set_defaults(func=with_dsn(cmd_pause), kind=kind)
        a = tsub.add_parser("resume", help=f"workers claim this {kind}'s jobs again")
        a.add_argument("name")
        a.add_argument(
            "--ramp",
            metavar="DURATION",
            help="let the backlog back in at a rate that rises over this long (e.g. 60s), tenfold in equal steps"
            " from 1/s to the rate (none set: 10,000/s); a rate below 1/s holds from the start",
        )
        a.set_defaults(func=with_dsn(cmd_resume), kind=kind)
        a = tsub.add_parser("rate", help=f"at most N of this {kind}'s jobs claimed per second or minute, fleet-wide")
        a.add_argument("name")
        a.add_argument("rate", type=rate_value, help="20/s, 1200/min, 30/h, or none")
        a.set_defaults(func=with_dsn(cmd_rate), kind=kind)
    a = qsub.add_parser("limit", help="cap how many jobs of a queue run at once across every worker")
    a.add_argument("name")
    a.add_argument("limit", type=limit_value, help="jobs running at once (0 holds the queue), or none")
    a.set_defaults(func=with_dsn(cmd_limit))
