"""A web console asked to quit while its read waits on a frozen database: it ends at once, by
itself, not after its server's grace and a kill (jobtui/web/bridge.py ConsoleProcess.stop)."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import psycopg

from jobtui.web.bridge import ConsoleProcess
from tests.proxy import Proxy
from tests.waits import hold, until

APP_NAME = "jobtui-test-web-quit"


def console_sessions(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (APP_NAME,)).fetchone()
    return int(row[0]) if row else 0


async def test_a_web_console_stopped_while_its_read_hangs_ends_by_itself(dsn: str) -> None:
    with Proxy(dsn) as proxy:
        env = {**os.environ, "JOBTUI_DSN": proxy.dsn(dsn), "PGAPPNAME": APP_NAME,
               "TEXTUAL_DRIVER": "textual.drivers.web_driver:WebDriver"}  # fmt: skip

        async def screen(_: bytes) -> None:
            return None

        console = ConsoleProcess([sys.executable, "-m", "jobtui.cli.webconsole", "--schema", "jobtui", "--read-only"],
                                 env, send=screen, label="test")  # fmt: skip
        running = asyncio.create_task(console.run(100, 30))
        try:
            await asyncio.wait_for(console.started.wait(), 30)
            await until(lambda: console_sessions(dsn) > 0, 30, "the console's connection")
            proxy.freeze()
            hold(1.5, "a refresh of the console (every second) now waits on the frozen connection")
            began = time.monotonic()
            await console.stop()
            await running
            took = time.monotonic() - began
        finally:
            proxy.thaw()
            if not running.done():
                running.cancel()
        assert console.process is not None and console.process.returncode == 0, console.why_not
        assert took < 5.0, took
