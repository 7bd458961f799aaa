"""`jobtui serve` in the fleet (core/members.py): its row, with the consoles it has open as its
work in flight and its address; an operator's stop ends it as SIGTERM does."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from jobtui.core.members import Member, Presence, Status, default_name, refresh_interval, resident_bytes
from jobtui.kernel.link import Connection, Link
from jobtui.kernel.safetext import line, quote, shorten

log = logging.getLogger("jobtui.serve")


class Registered:
    """`jobtui serve` in the fleet (core/members.py): its row, with the consoles it has open as
    its work in flight; an operator's stop ends it as SIGTERM does. It serves whether or not
    its row can be written (a database away, a role that may only read)."""

    def __init__(
        self,
        dsn: str,
        schema: str,
        pooler: str | None,
        consoles: Callable[[], int],
        stop: asyncio.Event,
        url: str,
    ) -> None:
        self.stop = stop
        self.consoles = consoles
        self.link = Link(dsn, pooler=pooler)
        self.conn = Connection(dsn, "fleet", link=self.link, pooler=pooler)
        member = Member(default_name(), "serve", refresh_interval(), metrics=url)
        self.presence = Presence(self.conn, schema, member, status=self._status, obey=self._obey, denied=self._denied)

    def _status(self) -> Status:
        state = "stopping" if self.stop.is_set() else "running"
        return Status(state, in_flight=self.consoles(), rss_bytes=resident_bytes())

    def _obey(self, wanted: str, by: str | None) -> None:
        if wanted == "stopping":
            log.warning("stopping: %s ordered it", quote(by or "an operator"))
            self.stop.set()

    def _denied(self, exc: Exception, what: str) -> None:
        log.warning("not registered in the fleet: %s was refused (%s)", what, line(shorten(str(exc))))

    async def run(self) -> None:
        await self.presence.run()

    async def leave(self) -> None:
        await self.presence.leave()
        await self.conn.close()
        await self.link.close()
