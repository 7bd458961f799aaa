"""The fleet's members: the row every long-running jobtui process keeps of itself in the
database, and operators' orders to it (migration 0016; reads/fleet.py reads the rows). The one
module that names the statements of sql/members.sql.

A worker, a standalone scheduler, the console's embedded worker and `jobtui serve` each run a
`Presence`: it writes the process's row when it starts, refreshes it on a slow timer of its
own (a third of a worker's lease, at most REFRESH seconds) by the database's clock, and
deletes it at a clean exit. A row not refreshed within `lost_after` (three intervals) reads as
lost; the archiver prunes lost rows (`prune_call`). The refresh is one small UPDATE of the
process's own row, never one per job.

An order (quiet, resume, stop) is written to the process's row with its audit row, in one
transaction (`give_order`); the process reads it in the answer of its next refresh and obeys
it once. A notification `fleet <id>` may make that refresh come at once; anyone who can
connect may send one, so it only makes the process read its row.

    presence = Presence(conn, schema, member, status=lambda: Status("running"), obey=obey)
    await presence.register()
    asyncio.create_task(presence.run())
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import psycopg

from jobtui.core.audit import Audit, Recorded, operate
from jobtui.kernel.checks import check_text
from jobtui.kernel.db import Call, Rows, first_line, run, statements
from jobtui.kernel.domain import DEFAULT_SCHEMA
from jobtui.kernel.errors import DatabaseUnavailable, InvalidInput
from jobtui.kernel.link import Connection
from jobtui.kernel.timeouts import wait_event
from jobtui.kernel.version import installed_version

log = logging.getLogger("jobtui.fleet")

Kind = Literal["worker", "scheduler", "console", "serve"]
KINDS: tuple[Kind, ...] = ("worker", "scheduler", "console", "serve")
Action = Literal["quiet", "resume", "stop"]
ACTIONS: tuple[Action, ...] = ("quiet", "resume", "stop")
# A process refreshes its row at least this often (a worker: every third of its lease, up to
# this), and reads as lost after LOST_AFTER_REFRESHES intervals without one.
REFRESH = 10.0
LOST_AFTER_REFRESHES = 3
# Lost rows are pruned once lost this long, and past the newest PRUNE_MOST of them.
PRUNE_AFTER = 3600.0
PRUNE_MOST = 500
# How long a clean exit waits for its row's deletion before leaving it to be found lost.
LEAVE_TIMEOUT = 5.0
# The most characters of a process's name the fleet keeps (a worker's id is checked against
# it, so that its row and its leases name it alike).
MAX_NAME = 200
# Refreshes that hints bring are at least this far apart: a flood of forged notifications
# costs each process at most a few small UPDATEs of its own row a second.
HINT_GAP = 0.2


def default_name() -> str:
    """A process's name in the fleet when it is given none: host:pid (a worker's default id)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def refresh_interval(lease: float | None = None) -> float:
    """How often a process refreshes its row: a third of a worker's lease (as its heartbeat
    goes), at most REFRESH seconds."""
    return REFRESH if lease is None else max(0.2, min(REFRESH, lease / 3))


@dataclass(frozen=True, slots=True)
class Member:
    """What a process says of itself when it registers."""

    name: str
    kind: Kind
    interval: float  # seconds between its refreshes
    queues: Mapping[str, int] = field(default_factory=dict)  # named queues it claims from, with slots
    every_queue: int | None = None  # slots it shares among every queue
    types: Sequence[str] = ()
    executor: str | None = None
    scheduler: bool = False
    metrics: str | None = None
    poll: float | None = None  # seconds between its claims while idle; None: it claims nothing
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    version: str = field(default_factory=installed_version)

    @property
    def lost_after(self) -> float:
        return LOST_AFTER_REFRESHES * self.interval


@dataclass(frozen=True, slots=True)
class Status:
    """What a process does now, written at each refresh."""

    state: str  # running, quiet, stopping
    in_flight: int = 0
    children: int | None = None
    rss_bytes: int | None = None
    # Seconds since its last answered claim; None: none since it started, or it claims nothing.
    claimed_ago: float | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    """What the row says an operator asked: the state wanted, how many orders so far, by whom."""

    wanted: str
    orders: int
    ordered_by: str | None

    @classmethod
    def of(cls, rows: Rows) -> Answer | None:
        if not rows:
            return None
        row = rows.dicts()[0]
        return cls(row["wanted"], int(row["orders"]), row["ordered_by"])


def resident_bytes() -> int | None:
    """This process's resident memory, from /proc (Linux); None elsewhere."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def register_call(member: Member, status: Status) -> Call[tuple[int, Answer]]:
    params = {
        "name": check_text(member.name, "process name")[:MAX_NAME],
        "kind": member.kind,
        "host": member.host[:255],
        "pid": member.pid,
        "version": member.version[:64],
        "lost_after": member.lost_after,
        "queues": json.dumps(dict(member.queues)),
        "every_queue": member.every_queue,
        "types": list(member.types),
        "executor": member.executor,
        "scheduler": member.scheduler,
        "metrics": member.metrics,
        "poll": member.poll,
        **_status(status),
    }

    def decode(rows: Rows) -> tuple[int, Answer]:
        answer = Answer.of(rows)
        assert answer is not None
        return int(rows.dicts()[0]["id"]), answer

    return Call("member_register", params, decode)


def _status(status: Status) -> dict[str, Any]:
    return {
        "state": status.state,
        "in_flight": status.in_flight,
        "children": status.children,
        "rss_bytes": status.rss_bytes,
        "claimed_ago": None if status.claimed_ago is None else max(0.0, status.claimed_ago),
    }


def refresh_call(row: int, status: Status, replacing: bool = True) -> Call[Answer | None]:
    """A refresh of row `row`; `replacing`: also delete this name's rows of before a restart,
    lost now (a process's first refreshes; the statement then costs a little more)."""
    return Call("member_refresh", {"id": row, "replacing": replacing, **_status(status)}, Answer.of)


def leave_call(row: int) -> Call[int]:
    return Call("member_leave", {"id": row}, len)


def prune_call(keep: float = PRUNE_AFTER, most: int = PRUNE_MOST) -> Call[int]:
    """Delete the rows lost for longer than `keep` seconds, and lost ones past the newest `most`."""
    return Call("member_prune", {"keep": keep, "most": most}, lambda rows: int(rows[0][0]))


Obey = Callable[[str, str | None], None]
Denied = Callable[[psycopg.errors.InsufficientPrivilege, str], None]


class Presence:
    """Keeps one process's row: registers it, refreshes it every interval (or soon after a
    hint), hands each new order to `obey(wanted, by)` once, and deletes it at a clean exit."""

    def __init__(
        self,
        conn: Connection,
        schema: str,
        member: Member,
        *,
        status: Callable[[], Status],
        obey: Obey,
        denied: Denied | None = None,
    ) -> None:
        self._conn = conn
        self._schema = schema
        self.member = member
        self._status = status
        self._obey = obey
        self._denied = denied
        self.id: int | None = None
        self._orders = 0  # the orders obeyed so far (the row's count when it was last read)
        self._written: Status | None = None
        self._hinted = asyncio.Event()
        self._last = 0.0  # when the last refresh was sent (monotonic)
        self._registered = 0.0  # when the row was written (monotonic)
        self.refreshes = 0  # for tests: refreshes written

    def look(self) -> None:
        """Refresh soon: a notification says an order may be waiting, or the state changed."""
        self._hinted.set()

    def hinted(self, row: int) -> None:
        """A notification names process `row`: read the row if it is this one's."""
        if row == self.id:
            self.look()

    async def register(self) -> None:
        """Write the row (waiting out an outage); raises what a refused privilege raises."""
        status = self._status()
        row, answer = await self._conn.run(register_call(self.member, status), self._schema)
        self.id = row
        self._registered = time.monotonic()
        self._written = status
        self._orders = answer.orders

    async def run(self) -> None:
        """Refresh until cancelled; registers first when `register` was not awaited."""
        try:
            if self.id is None:
                await self.register()
            while True:
                await wait_event(self._hinted, self.member.interval)
                await asyncio.sleep(max(0.0, self._last + HINT_GAP - time.monotonic()))
                self._hinted.clear()
                await self.refresh()
        except psycopg.errors.InsufficientPrivilege as exc:
            if self._denied is None:
                raise
            self._denied(exc, "the fleet's registry")

    async def refresh(self) -> None:
        """One refresh, then at once another when obeying an order changed the state."""
        for _ in range(2):
            self._last = time.monotonic()
            status = self._status()
            try:
                answer = await self._write(status)
            except psycopg.errors.InsufficientPrivilege:
                raise
            except (psycopg.OperationalError, DatabaseUnavailable):
                return  # the database is away: the next interval tries again
            except psycopg.Error as exc:
                log.warning("fleet refresh failed: %s", first_line(exc))
                return
            self.refreshes += 1
            if answer is None or answer.orders == self._orders:
                return
            self._orders = answer.orders
            self._obey(answer.wanted, answer.ordered_by)
            if self._status().state == status.state:
                return

    async def _write(self, status: Status) -> Answer | None:
        assert self.id is not None
        # A row of this name of before a restart reads as lost within lost_after of the restart.
        replacing = time.monotonic() - self._registered < 2 * self.member.lost_after + self.member.interval
        answer = await self._conn.run(refresh_call(self.id, status, replacing), self._schema, retry=False)
        if answer is None:
            # Pruned while away (lost for longer than the prune bound): register again.
            log.warning("this process's row in the fleet was pruned while it was away; registering again")
            await self.register()
            return None
        self._written = status
        return answer

    async def leave(self) -> None:
        """Delete the row (a clean exit); after LEAVE_TIMEOUT it is left to be found lost."""
        if self.id is None:
            return
        try:
            async with asyncio.timeout(LEAVE_TIMEOUT):
                await self._conn.run(leave_call(self.id), self._schema, retry=False)
        except (TimeoutError, psycopg.Error, DatabaseUnavailable) as exc:
            log.warning("could not remove this process from the fleet (%s): it will show as lost", first_line(exc))
        else:
            self.id = None


# -- orders ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    """Which processes an order is for: by ids (the rows an operator saw), name, host and
    version, all that are given."""

    ids: Sequence[int] | None = None
    name: str | None = None
    host: str | None = None
    version: str | None = None

    def describe(self) -> str:
        parts = [f"{what} {value}" for what, value in (("name", self.name), ("host", self.host),
                                                       ("version", self.version)) if value is not None]  # fmt: skip
        if self.ids is not None:
            parts.append(f"{len(self.ids)} process(es) chosen")
        return ", ".join(parts) or "every process"


@dataclass(frozen=True, slots=True)
class Matched:
    """A process an order matched, and what became of it."""

    id: int
    name: str
    kind: str
    host: str
    version: str
    state: str
    wanted: str
    live: bool
    changed: bool


@dataclass(frozen=True, slots=True)
class OrderResult:
    action: Action
    matched: list[Matched]

    @property
    def changed(self) -> list[Matched]:
        return [m for m in self.matched if m.changed]

    @property
    def unchanged(self) -> list[Matched]:
        return [m for m in self.matched if m.live and not m.changed]


_DONE = {"quiet": "quieted", "resume": "resumed", "stop": "told to stop"}


def why_unchanged(action: Action, m: Matched) -> str:
    """Why an order left live process `m` as it was, in a few words."""
    if m.state == "stopping" or m.wanted == "stopping":
        return "already stopping"
    if action != "stop" and m.kind == "serve":
        return "serve claims no jobs (stop it instead)"
    if action == "quiet":
        return "already quiet" if m.state == "quiet" else "quiet already asked"
    return "not quiet"


def order_call(action: Action, target: Target, actor: str, schema: str) -> Call[OrderResult]:
    params = {
        "action": action,
        "ids": None if target.ids is None else list(target.ids),
        "name": target.name,
        "host": target.host,
        "version": target.version,
        "actor": check_text(actor, "actor"),
        "channel": statements(schema).channel,
    }
    fields = ("id", "name", "kind", "host", "version", "state", "wanted", "live", "changed")

    def decode(rows: Rows) -> OrderResult:
        return OrderResult(action, [Matched(**{f: r[f] for f in fields}) for r in rows.dicts()])

    return Call("member_order", params, decode)


def give_order(
    conn: psycopg.Connection[Any], action: Action, target: Target, *, actor: str, schema: str = DEFAULT_SCHEMA
) -> OrderResult:
    """Quiet, resume or stop the live processes `target` matches, with its audit row.

    Raises InvalidInput (one line; nothing written) when no live process matches, or when
    every one matched is already as asked (a stop of one already stopping, say).
    """
    if action not in ACTIONS:
        raise InvalidInput(f"unknown order {action!r}: use quiet, resume or stop")
    for value, what in ((target.name, "name"), (target.host, "host"), (target.version, "version")):
        if value is not None:
            check_text(value, what)

    def change(conn: psycopg.Connection[Any]) -> OrderResult:
        result = run(conn, order_call(action, target, actor, schema), schema)
        refuse_if_nothing(result, target)
        return result

    audit = Audit(actor, f"fleet-{action}", target.describe())
    return operate(conn, change, audit, lambda r: Recorded(len(r.changed), detail=order_detail(r)), schema)


def order_detail(result: OrderResult) -> dict[str, Any]:
    return {"processes": [{"id": m.id, "name": m.name, "host": m.host} for m in result.changed]}


def refuse_if_nothing(result: OrderResult, target: Target) -> None:
    """InvalidInput, in one line, for an order that changes no process: which were matched and why."""
    if result.changed:
        return
    what = target.describe()
    if not result.matched:
        raise InvalidInput(f"no process of the fleet matches {what}; see `jobtui workers`")
    live = [m for m in result.matched if m.live]
    if not live:
        names = ", ".join(sorted({m.name for m in result.matched})[:5])
        raise InvalidInput(f"every process matching {what} is lost (not seen within its bound): {names}")
    reasons = sorted({f"{m.name}: {why_unchanged(result.action, m)}" for m in live})
    shown = "; ".join(reasons[:5]) + (f"; and {len(reasons) - 5} more" if len(reasons) > 5 else "")
    raise InvalidInput(f"nothing to {result.action}: {shown}")


def done_word(action: Action) -> str:
    return _DONE[action]
