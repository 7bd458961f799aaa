"""`jobtui workers`: the fleet, one line per registered process (reads/fleet.py), and
`jobtui workers quiet|resume|stop NAME|--host H|--version V`, an operator's order to the
processes matched (core/members.py), audited and refused with `--read-only`. Every name from
the table is printed escaped; `--json` prints it exact."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from rich.table import Table
from rich.text import Text

from jobtui.cli.args import with_dsn
from jobtui.cli.ops import wide_console
from jobtui.cli.output import print_json
from jobtui.core.members import ACTIONS, REFRESH, Action, Target, done_word, give_order, why_unchanged
from jobtui.kernel.db import connect, run
from jobtui.kernel.errors import InvalidInput
from jobtui.kernel.safetext import line, quote
from jobtui.kernel.sizes import size_text
from jobtui.kernel.version import installed_version
from jobtui.reads.fleet import Fleet, Holder, Process, findings, holders, read_fleet
from jobtui.reads.metrics import QueueLocked, RunningGroup, queue_locked, read_transaction, running_groups_call
from jobtui.reads.overview import QueueLine, overview
from jobtui.tui.render import age

STATES = ("running", "quiet", "stopping", "lost")
SORTS = {
    "host": lambda p: (p.host, p.name, p.id),
    "name": lambda p: (p.name, p.id),
    "kind": lambda p: (p.kind, p.host, p.name),
    "version": lambda p: (p.version, p.host, p.name),
    "state": lambda p: (p.status, p.host, p.name),
    "up": lambda p: (p.up, p.name),
    "seen": lambda p: (p.seen_ago, p.name),
    "in-flight": lambda p: (-p.in_flight, p.name),
    "memory": lambda p: (-(p.rss_bytes or 0), p.name),
}


def shown(fleet: Fleet, args: argparse.Namespace) -> list[Process]:
    """The processes the filters keep, in the order asked."""
    kept = [
        p
        for p in fleet.processes
        if (args.host is None or p.host == args.host)
        and (args.version is None or p.version == args.version)
        and (args.queue is None or p.serves(args.queue))
        and (args.state is None or p.status == args.state)
        and (args.kind is None or p.kind == args.kind)
    ]
    return sorted(kept, key=SORTS[args.sort])


def state_text(p: Process) -> Text:
    """`running`, `quiet`, `stopping`, `LOST 2m ago` (red), with an order not taken up yet."""
    if p.lost:
        return Text(f"LOST {age(p.seen_ago)} ago", style="bold red")
    text = Text(p.state, style="dark_orange" if p.state != "running" else "")
    if p.asked is not None:
        text.append(f" ({p.asked} asked)", style="dim")
    return text


def work_text(p: Process) -> str:
    """Its jobs in flight of its slots; for `serve`, its consoles open."""
    if p.kind == "serve":
        return f"{p.in_flight} console{'s' if p.in_flight != 1 else ''}"
    if p.kind == "scheduler":
        return "-"
    return f"{p.in_flight}/{p.slots}"


def fleet_table(processes: list[Process]) -> Table:
    table = Table(
        "name", "kind", "host", "pid", "version", "state", "queues", "in flight", "types", "executor", "memory",
        "up", "seen", title="The fleet",
    )  # fmt: skip
    for p in processes:
        table.add_row(
            p.name,
            p.kind + (" +scheduler" if p.scheduler and p.kind != "scheduler" else ""),
            p.host,
            str(p.pid),
            p.version,
            state_text(p),
            p.queues_text() if p.claims else "-",
            work_text(p),
            str(len(p.types)) if p.claims else "-",
            (p.executor or "-") + (f" ({p.children} children)" if p.children else ""),
            size_text(p.rss_bytes),
            age(p.up),
            f"{age(p.seen_ago)} ago",
        )
    return table


def holder_line(h: Holder) -> str:
    why = "lost" if h.lost else "not registered"
    beat = f", heartbeat {age(h.heartbeat_age)} ago" if h.heartbeat_age is not None else ""
    expired = f", {h.expired} lease(s) expired" if h.expired else ""
    return f"  {h.name} ({why}): {h.jobs} job(s) held{beat}{expired}"


def cmd_list(args: argparse.Namespace, dsn: str) -> int:
    locked: str | None = None
    groups: list[RunningGroup] = []
    lines: list[QueueLine] = []
    with connect(dsn, autocommit=True, pooler=args.pooler) as conn:
        fleet = read_fleet(conn, args.schema)
        try:
            # The job table's reads wait for a lock no longer than the console's do: the
            # fleet's own table is read, and shown, whatever holds the job table.
            with queue_locked(conn, args.schema):
                with read_transaction(conn, args.schema):
                    groups = run(conn, running_groups_call(), args.schema)
                lines = overview(conn, args.schema).lines
        except QueueLocked as exc:
            locked = str(exc)
    held = holders(fleet, groups)
    found = findings(fleet, lines, held)
    processes = shown(fleet, args)
    if args.json:
        out = {
            "processes": [{**p._asdict(), "status": p.status, "asked": p.asked} for p in processes],
            "lease_holders_without_a_live_row": [asdict(h) for h in held],
            "findings": [asdict(f) for f in found],
            "job_table_locked": locked,
        }
        print_json(out)
        return 0
    console = wide_console()
    if processes:
        console.print(fleet_table(processes))
    else:
        console.print("no process of the fleet matches" if fleet.processes else "no process is registered")
    if locked is not None:
        console.print(Text(line(f"{locked}: the leases held and the findings were not read"), style="bold red"))
    for finding in found:
        console.print(Text(line(finding.text), style="bold red" if finding.level == "crit" else "dark_orange"))
    unregistered = [h for h in held if not h.lost]
    if held:
        console.print(
            f"Workers holding leases without a live row (workers of jobtui before {installed_version()} do not"
            " register; what their leases show):"
        )
        for h in held:
            console.print(holder_line(h))
    elif not fleet.processes and not unregistered and locked is None:
        console.print(f"(workers of jobtui before {installed_version()} do not register: they show by their leases)")
    return 0


def cmd_order(args: argparse.Namespace, dsn: str) -> int:
    action: Action = args.action
    if args.name is None and args.host is None and args.version is None:
        raise InvalidInput(
            f"`jobtui workers {action}` needs a NAME, --host HOST or --version VERSION (see `jobtui workers`)"
        )
    target = Target(name=args.name, host=args.host, version=args.version)
    with connect(dsn, pooler=args.pooler) as conn:
        result = give_order(conn, action, target, actor=args.actor, schema=args.schema)
    names = ", ".join(f"{quote(m.name)} on {quote(m.host)}" for m in result.changed)
    print(line(f"{done_word(action)}: {names}"))
    for m in result.unchanged:
        print(line(f"left as it was: {quote(m.name)}: {why_unchanged(action, m)}"))
    lost = [m for m in result.matched if not m.live]
    if lost:
        print(line(f"lost, not told: {', '.join(quote(m.name) for m in lost)}"))
    what = {
        "quiet": "it claims no new jobs and its jobs in flight finish",
        "resume": "it claims jobs again",
        "stop": "it stops as on SIGTERM: its jobs in flight get its shutdown timeout, then it exits",
    }[action]
    print(
        f"each reads the order at once where it listens for notifications, else at its next refresh (within"
        f" {REFRESH:g}s); then {what}"
    )
    return 0


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "workers",
        help="the fleet: every live worker, scheduler and server, its queues, version and state; quiet, resume"
        " or stop them",
    )
    p.add_argument("--json", action="store_true")
    p.add_argument("--host", help="only the processes of this host")
    p.add_argument("--queue", help="only the processes that claim from this queue")
    p.add_argument("--version", help="only the processes of this jobtui version")
    p.add_argument("--state", choices=STATES, help="only the processes in this state")
    p.add_argument("--kind", choices=("worker", "scheduler", "console", "serve"), help="only this kind of process")
    p.add_argument("--sort", choices=tuple(SORTS), default="host", help="the order of the lines (default host)")
    p.set_defaults(func=with_dsn(cmd_list))
    wsub = p.add_subparsers(dest="action", metavar="ACTION")
    helps = {
        "quiet": "stop claiming new jobs; the jobs in flight finish (the first step of a deploy)",
        "resume": "claim jobs again after a quiet",
        "stop": "shut down as SIGTERM does: the jobs in flight finish or are released, the process exits 0",
    }
    for action in ACTIONS:
        a = wsub.add_parser(action, help=helps[action])
        a.add_argument("name", nargs="?", help="the process's name, as `jobtui workers` lists it")
        a.add_argument("--host", help="every live process of this host")
        a.add_argument("--version", help="every live process of this jobtui version")
        a.set_defaults(func=with_dsn(cmd_order), action=action)
