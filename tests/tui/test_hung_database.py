"""A database that stops answering (hung, not refusing): the header turns red within 3 s,
says how old the figures are, the keys still work, and it recovers when the server does.

Two real ways to hang: a TCP proxy that stops moving bytes (a partition; new connections
hang too), and SIGSTOP on the PostgreSQL backend the console reads through.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest

from jobtui.tui.app import JobtuiApp

from ..proxy import Proxy
from ..waits import wait_until
from .helpers import seed, wait_for

SIZE = (120, 36)


def header_text(app: JobtuiApp) -> str:
    content: Any = app.query_one("#vitals").content  # type: ignore[attr-defined]
    return str(content.plain)


async def assert_turns_red_and_recovers(app: JobtuiApp, pilot: Any, hang: Any, resume: Any) -> None:
    await wait_for(pilot, lambda: app.latest is not None, what="the first read")
    assert "NOT ANSWERING" not in header_text(app) and "ready" in header_text(app)
    hang()
    hung_at = time.monotonic()
    try:
        await wait_for(pilot, lambda: "DATABASE NOT ANSWERING" in header_text(app), timeout=3.0, what="a red header")
        assert time.monotonic() - hung_at <= 3.0
        assert "data " in header_text(app) and " old" in header_text(app)
        assert "dead 5" in header_text(app)  # the last figures stay on screen
        await pilot.press("3")  # the keys answer while the read waits
        await wait_for(pilot, lambda: app.pane == "dead", timeout=1.0, what="the dead pane")
    finally:
        resume()
    await wait_for(pilot, lambda: "NOT ANSWERING" not in header_text(app), timeout=10.0, what="the header to recover")
    read = app.latest.read_at if app.latest else 0.0
    await wait_for(pilot, lambda: app.latest is not None and app.latest.read_at > read, what="a fresh read")


async def test_a_frozen_connection_turns_the_header_red(dsn: str) -> None:
    seed(dsn)
    with Proxy(dsn) as proxy:
        app = JobtuiApp(proxy.dsn(dsn), refresh_interval=0.25)
        async with app.run_test(size=SIZE) as pilot:
            await assert_turns_red_and_recovers(app, pilot, proxy.freeze, proxy.thaw)
            await app.action_quit()


async def test_a_stopped_backend_turns_the_header_red(dsn: str) -> None:
    seed(dsn)
    app = JobtuiApp(dsn, refresh_interval=0.25)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.latest is not None, what="the first read")
        pid = app.source.backend_pid()
        await assert_turns_red_and_recovers(
            app, pilot, lambda: os.kill(pid, signal.SIGSTOP), lambda: os.kill(pid, signal.SIGCONT)
        )
        await app.action_quit()


async def test_quit_while_the_database_hangs_takes_under_a_second(dsn: str) -> None:
    with Proxy(dsn) as proxy:
        app = JobtuiApp(proxy.dsn(dsn), refresh_interval=0.25)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.latest is not None, what="the first read")
            proxy.freeze()
            await wait_for(pilot, lambda: app.source.busy_for() > 0.5, what="a read that waits")
            started = time.monotonic()
            await pilot.press("q")
            await wait_for(pilot, lambda: app.return_code is not None, timeout=1.0, what="the console to quit")
        assert time.monotonic() - started < 1.0


def fetching(source: Any) -> tuple[threading.Thread, list[BaseException]]:
    """A refresh of `source` running in a thread, as the console's are; what it raised."""
    failed: list[BaseException] = []

    def read() -> None:
        try:
            source.fetch()
        except BaseException as exc:  # the outcome under test
            failed.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader, failed


def test_a_connection_that_hangs_before_its_session_is_set_is_given_up_too(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The partition comes between the connection's opening and the answer to its first
    statements: the watchdog ends that wait as it ends a read's, and the next read, once the
    network is back, connects again."""
    from jobtui.kernel import db
    from jobtui.tui import data

    with Proxy(dsn) as proxy:

        def opened_then_frozen(*args: Any, **kwargs: Any) -> Any:
            conn = db.connect(*args, **kwargs)
            proxy.freeze()
            return conn

        monkeypatch.setattr(data, "connect", opened_then_frozen)
        source = data.DataSource(proxy.dsn(dsn), "jobtui")
        reader, failed = fetching(source)
        try:
            wait_until(lambda: source.busy_for() > 1.0, 10.0, "the read waiting on the frozen connection")
            assert source.give_up_if_hung(after=1.0)
            reader.join(5.0)
            assert not reader.is_alive(), "the read still waits on the frozen connection"
            assert failed, "the read returned although the server never answered"
        finally:
            proxy.thaw()
        monkeypatch.setattr(data, "connect", db.connect)
        assert source.fetch().snapshot is not None
        source.close()


def test_a_quit_while_the_connection_opens_ends_the_read_at_once(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The console quits as the read's connection is made, and the network then stops: the
    read sets up no session on the quitting console, so it ends at once, not once the network
    is back."""
    from jobtui.kernel import db
    from jobtui.tui import data

    with Proxy(dsn) as proxy:
        source = data.DataSource(proxy.dsn(dsn), "jobtui")

        def quit_then_frozen(*args: Any, **kwargs: Any) -> Any:
            conn = db.connect(*args, **kwargs)
            source.close()  # the quit, before the read could name its connection
            proxy.freeze()
            return conn

        monkeypatch.setattr(data, "connect", quit_then_frozen)
        reader, failed = fetching(source)
        try:
            reader.join(5.0)
            assert not reader.is_alive(), "the read waits on a frozen connection of a console that quit"
            assert failed and "closing" in str(failed[0]), failed
        finally:
            proxy.thaw()


def test_a_quit_as_the_connection_is_handed_out_leaves_no_connection_open(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The quit lands after the session was set up, as the connection is being handed out:
    the read does not go on to use it, and no connection of the console is left open."""
    from jobtui.kernel import db
    from jobtui.kernel.errors import DatabaseUnavailable
    from jobtui.tui import data

    source = data.DataSource(dsn, "jobtui")
    real_where = data.Where
    opened: list[Any] = []

    def connecting(*args: Any, **kwargs: Any) -> Any:
        opened.append(db.connect(*args, **kwargs))
        return opened[-1]

    def quit_then_where(*args: Any, **kwargs: Any) -> Any:
        source.close()  # the quit, between the session's answer and the hand-out
        return real_where(*args, **kwargs)

    monkeypatch.setattr(data, "Where", quit_then_where)
    monkeypatch.setattr(data, "connect", connecting)
    with pytest.raises(DatabaseUnavailable, match="closing"):
        source.fetch()
    assert len(opened) == 1 and opened[0].closed, "the quitting console left its connection open"
