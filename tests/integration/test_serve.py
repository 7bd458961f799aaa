"""`jobtui serve` spoken to as a browser speaks to it: the real server, real console processes
on a real database, over HTTP and the WebSocket protocol of textual-serve's client.

What a person does in Chromium is in tests/browser/; here are the refusals and the limits,
including what no browser page would send.
"""

from __future__ import annotations

import asyncio
import io
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import aiohttp
import psycopg
import pytest

from jobtui.cli.main import main
from jobtui.core import queues
from tests.waits import wait_until
from tests.web import (
    PASSWORDS,
    ProtocolConsole,
    ServeProcess,
    audit_rows,
    console_connections,
    console_started,
    open_console,
    openssl_cert,
    read_only_role,
    seed_dead,
    signed_in,
    started_console,
    statuses,
)
from tests.workers import ROOT

DEAD_PANE = "3 Dead"


@pytest.fixture
def viewer_dsn(dsn: str) -> Iterator[str]:
    """The DSN of a read-only role (docs/grants.sql), for viewers' consoles."""
    with read_only_role(dsn) as made:
        yield made


@pytest.fixture
def server(dsn: str, users: Path, viewer_dsn: str) -> Iterator[ServeProcess]:
    serve = ServeProcess(dsn, users, viewer_dsn=viewer_dsn)
    yield serve
    serve.stop()


async def viewer_changed_nothing(console: ProtocolConsole, dsn: str, ids: list[int]) -> None:
    """The keys sent so far were read (the help shows only after them: the keys are read in
    order), none of them left a question open, and the dead jobs `ids` and the audit log
    are as they were."""
    await console.keys("?")
    screen = await console.wait("the help", lambda s: "this help" in s)
    assert "row(s) will change" not in screen
    assert statuses(dsn, ids) == ["dead"] * len(ids)
    assert audit_rows(dsn) == []


async def test_a_viewer_cannot_force_a_change_down_the_socket(dsn: str, server: ServeProcess) -> None:
    ids = seed_dead(dsn)
    async with await signed_in(server.url, "bob") as client:
        console, screen = await started_console(client, server.url)
        assert "read-only console" in screen
        await console.keys("3")
        await console.wait("the dead group", lambda s: "SMTPError" in s)
        # What a key press cannot do, the same bytes sent straight down the socket cannot either:
        # requeue the group, answer yes, requeue one job from the group's list, yes again.
        await console.keys("r", "y", "\r", "r", "y", "R", "y", "\x1b", "\x1b")
        await viewer_changed_nothing(console, dsn, ids)

    # The same keys from an operator do change the queue: the refusal above is the viewer's.
    async with await signed_in(server.url, "alice") as client:
        console, _ = await started_console(client, server.url)
        await console.keys("3")
        await console.wait("the dead group", lambda s: "SMTPError" in s)
        await console.keys("r")
        await console.wait("the question", lambda s: f"{len(ids)} row(s) will change" in s)
        await console.keys("y")
        await console.wait("the toast", lambda s: f"requeued {len(ids)} job(s)" in s)
    assert statuses(dsn, ids) == ["ready"] * len(ids)
    assert audit_rows(dsn) == [("web:alice", "requeue", len(ids))]


async def test_the_jobs_search_and_its_bulk_keys_in_the_browser_console(dsn: str, server: ServeProcess) -> None:
    """The filter box's search words open the jobs search over the socket; its bulk keys (and
    the Queues pane's rate key) change nothing for a viewer, and run for an operator, audited
    as the signed-in user."""
    ids = seed_dead(dsn, 4, "sms.send")
    search = "type:sms.send status:dead\r"
    async with await signed_in(server.url, "bob") as client:
        console, _ = await started_console(client, server.url)
        await console.keys("/")
        await console.wait("the filter box", lambda s: "search jobs: payload:" in s)
        await console.keys(*search)
        await console.wait("the jobs search", lambda s: "Jobs matching type:sms.send" in s and "Back / cancel" in s)
        assert "Requeue all" not in console.screen.text()
        await console.keys("r", "y", "y", "\x1b")
        await console.keys("7", "t", "5", "/", "s", "\r", "y", "\x1b")
        await viewer_changed_nothing(console, dsn, ids)

    async with await signed_in(server.url, "alice") as client:
        console, _ = await started_console(client, server.url)
        await console.keys("/")
        await console.wait("the filter box", lambda s: "search jobs: payload:" in s)
        await console.keys(*search)
        await console.wait("the jobs search", lambda s: "Requeue all" in s)
        await console.keys("r")
        await console.wait("the question", lambda s: "4 row(s) will change" in s)
        await console.keys("y")
        await console.wait("the toast", lambda s: "requeued 4 job(s)" in s)
    assert statuses(dsn, ids) == ["ready"] * len(ids)
    assert audit_rows(dsn) == [("web:alice", "bulk-requeue", len(ids))]


UP = "\x1b[A"


def queue_control(dsn: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return sorted(str(r[0]) for r in conn.execute("SELECT t::text FROM jobtui.queue_control t"))


async def test_a_viewer_sends_every_lever_and_bulk_key_and_changes_nothing(dsn: str, server: ServeProcess) -> None:
    """The Queues pane's ramp, pause and limit keys on a paused queue, and the jobs search's
    discard and cancel keys, each with the answers an operator would type, sent down a viewer's
    socket: no audit row, no job and no queue lever changes. The same ramp keys from an
    operator resume the queue, so the row under the cursor is the paused queue."""
    dead = seed_dead(dsn, 4, "sms.send")
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("INSERT INTO jobtui.job (type) SELECT 'sms.send' FROM generate_series(1, 2) RETURNING id")
        ready = [int(r[0]) for r in rows]
        queues.pause(conn, "queue", "default", actor="setup")
        queues.pause(conn, "type", "sms.send", actor="setup")
        queues.set_limit(conn, "default", 3, actor="setup")
    audited, levers = audit_rows(dsn), queue_control(dsn)
    assert len(audited) == 3 and len(levers) == 2, (audited, levers)
    async with await signed_in(server.url, "bob") as client:
        console, _ = await started_console(client, server.url)
        await console.keys("7")
        await console.wait("the paused queue", lambda s: "by setup" in s)
        # The pane opens on the Ready pane's type; up is the queue's row.
        await console.keys(UP, "u", "\r", "y", "\x1b")  # ramp: 60s, enter, yes
        await console.keys("7", UP, "p", "y", "\x1b")  # resume: yes
        await console.keys("7", UP, "l", "\r", "y", "\x1b")  # limit: none, enter, yes
        await console.keys("/")
        await console.wait("the filter box", lambda s: "search jobs: payload:" in s)
        await console.keys(*"type:sms.send\r")
        screen = await console.wait("the jobs search", lambda s: "Jobs matching type:sms.send" in s)
        assert "Discard all" not in screen and "Cancel all" not in screen
        await console.keys("d", "y", "y", "c", "y", "y", "\x1b")
        await console.keys("?")
        screen = await console.wait("the help", lambda s: "this help" in s)
        assert "row(s) will change" not in screen
    assert statuses(dsn, dead) == ["dead"] * len(dead)
    assert statuses(dsn, ready) == ["ready"] * len(ready)
    assert audit_rows(dsn) == audited
    assert queue_control(dsn) == levers

    async with await signed_in(server.url, "alice") as client:
        console, _ = await started_console(client, server.url)
        await console.keys("7")
        await console.wait("the paused queue", lambda s: "by setup" in s)
        await console.keys(UP, "u")
        await console.wait("the ramp box", lambda s: "Resume queue default: how long its rate rises" in s)
        await console.keys("\r")
        await console.wait("the question", lambda s: "Resume queue default with a ramp of 60s?" in s)
        await console.keys("y")
        await console.wait("the toast", lambda s: "queue default resumed, its rate rising over 60s" in s)
    assert audit_rows(dsn) == [*audited, ("web:alice", "queue-resume", 1)]
    assert queue_control(dsn) != levers


async def test_each_console_process_ends_with_its_socket(dsn: str, server: ServeProcess) -> None:
    async with await signed_in(server.url, "alice") as client:
        first = await open_console(client, server.url)
        second = await open_console(client, server.url)
        for console in (first, second):
            await console.wait("the console", console_started)
        assert len(server.consoles()) == 2
        # One connection for the panes' reads (the operator's changes open theirs when used).
        assert wait_until(lambda: console_connections(dsn, "alice") == 2, 10, "a connection per console")

        await first.socket.close()
        wait_until(lambda: len(server.consoles()) == 1, 15, "the first console's process to end", server.log)
        wait_until(lambda: console_connections(dsn, "alice") == 1, 10, "its database connection closed")

        # Signing out closes the session's other consoles from the server's side.
        async with client.post(f"{server.url}/logout", headers={"Origin": server.url}, allow_redirects=False) as out:
            assert out.status == 303
        assert await second.until_closed() == 4001
        wait_until(lambda: server.consoles() == [], 15, "every console process to end", server.log)
        wait_until(lambda: console_connections(dsn, "alice") == 0, 10, "every console connection closed")
        # And the cookie of the session that ended opens nothing.
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await open_console(client, server.url)
        assert refused.value.status == 403


async def test_no_session_no_console(server: ServeProcess) -> None:
    async with aiohttp.ClientSession() as client:
        async with client.get(f"{server.url}/", allow_redirects=False) as page:
            assert page.status == 303 and page.headers["Location"] == "/login"
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await open_console(client, server.url)
        assert refused.value.status == 403
        with pytest.raises(aiohttp.WSServerHandshakeError):  # a made-up cookie is no session
            client.cookie_jar.update_cookies({"jobtui": "made-up"})
            await open_console(client, server.url)
    assert server.consoles() == []
    assert server.said("console refused to 127.0.0.1: no live session")


async def test_a_page_of_another_origin_opens_no_console(server: ServeProcess) -> None:
    async with await signed_in(server.url, "alice") as client:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await open_console(client, server.url, origin="http://127.0.0.1:1")  # same site, other origin
        assert refused.value.status == 403
        with pytest.raises(aiohttp.WSServerHandshakeError):
            await open_console(client, server.url, origin="null")
        # Nor signs in, or out, with a form of its own.
        form = {"name": "alice", "password": PASSWORDS["alice"]}
        for path, data in (("/login", form), ("/logout", {})):
            async with client.post(f"{server.url}{path}", data=data, headers={"Origin": "http://evil.example"}) as r:
                assert r.status == 403
        await started_console(client, server.url)  # the session was not signed out
    assert server.said("Origin 'http://127.0.0.1:1' is not")


async def test_wrong_passwords_are_refused_slowly_and_logged(server: ServeProcess) -> None:
    async with aiohttp.ClientSession() as client:
        for name, password in (("alice", "not-her-password"), ("nobody", "any-password-at-all")):
            began = time.monotonic()
            form = {"name": name, "password": password}
            async with client.post(f"{server.url}/login", data=form, headers={"Origin": server.url}) as answer:
                assert answer.status == 401
                assert "Wrong name or password" in await answer.text()
                assert "Set-Cookie" not in answer.headers
            assert time.monotonic() - began >= 1.0
        # Two failures in a row from this address: the next attempt waits, even with the right
        # password, and is answered without being checked.
        form = {"name": "alice", "password": PASSWORDS["alice"]}
        async with client.post(f"{server.url}/login", data=form, headers={"Origin": server.url}) as answer:
            assert answer.status == 429
            assert int(answer.headers["Retry-After"]) >= 1
    assert server.said("failed sign-in as 'alice' from 127.0.0.1 (1 in a row)")
    assert server.said("failed sign-in as 'nobody' from 127.0.0.1 (2 in a row)")
    assert server.said("refused unchecked")


async def test_an_idle_session_is_signed_out_and_its_console_closed(dsn: str, users: Path, viewer_dsn: str) -> None:
    server = ServeProcess(dsn, users, "--idle-timeout", "2s", viewer_dsn=viewer_dsn)
    try:
        async with await signed_in(server.url, "alice") as client:
            console, _ = await started_console(client, server.url)
            # Left alone, with the console refreshing on its own, the session ends.
            assert await console.until_closed(timeout=15) == 4001
            async with client.get(f"{server.url}/", allow_redirects=False) as page:
                assert page.status == 303 and page.headers["Location"] == "/login"
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await open_console(client, server.url)
            assert refused.value.status == 403
        wait_until(lambda: server.consoles() == [], 15, "the console process to end", server.log)
        assert server.said("'alice' signed out: idle")
    finally:
        server.stop()


async def test_consoles_past_the_limit_are_refused(dsn: str, users: Path, viewer_dsn: str) -> None:
    server = ServeProcess(dsn, users, "--max-sessions", "1", viewer_dsn=viewer_dsn)
    try:
        async with await signed_in(server.url, "alice") as client, await signed_in(server.url, "bob") as other:
            first, _ = await started_console(client, server.url)
            refused = await open_console(other, server.url)
            assert await refused.until_closed() == 4002
            assert "consoles are open, the most this server runs at once" in refused.screen.text()
            assert len(server.consoles()) == 1
            await first.keys("q")  # quit: the console ends, and its socket with it
            assert await first.until_closed() == 1000
            wait_until(lambda: server.consoles() == [], 15, "the console process to end", server.log)
            await started_console(other, server.url, "a console again")
    finally:
        server.stop()


def test_tls_cookie_is_secure_and_host_only(dsn: str, users: Path, tmp_path: Path, viewer_dsn: str) -> None:
    pair = openssl_cert(tmp_path)
    if pair is None:
        pytest.skip("the openssl command is not installed")
    cert, key = pair
    server = ServeProcess(dsn, users, "--cert", str(cert), "--key", str(key), viewer_dsn=viewer_dsn)
    try:
        assert server.url.startswith("https://127.0.0.1:")

        async def sign_in() -> aiohttp.ClientResponse:
            context = ssl.create_default_context(cafile=str(cert))
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as client:
                form = {"name": "alice", "password": PASSWORDS["alice"]}
                async with client.post(
                    f"{server.url}/login", data=form, headers={"Origin": server.url}, allow_redirects=False
                ) as answer:
                    return answer

        answer = asyncio.run(sign_in())
        assert answer.status == 303
        cookie = answer.headers["Set-Cookie"]
        assert cookie.startswith("__Host-jobtui=")
        for flag in ("HttpOnly", "Secure", "SameSite=Strict", "Path=/"):
            assert flag in cookie
        assert "Domain" not in cookie
        assert answer.headers["Strict-Transport-Security"].startswith("max-age=")
    finally:
        server.stop()


async def test_plain_http_cookie_and_a_trusted_proxy(dsn: str, users: Path, viewer_dsn: str) -> None:
    form = {"name": "alice", "password": PASSWORDS["alice"]}
    forwarded = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "198.51.100.7"}
    for proxy, secure, client_address in (
        ([], False, "127.0.0.1"),
        (["--trusted-proxy", "127.0.0.1"], True, "198.51.100.7"),
    ):
        server = ServeProcess(dsn, users, *proxy, viewer_dsn=viewer_dsn)
        try:
            origin = server.url.replace("http://", "https://") if secure else server.url
            async with aiohttp.ClientSession() as client:
                headers = {"Origin": origin, **forwarded}
                async with client.post(f"{server.url}/login", data=form, headers=headers, allow_redirects=False) as ok:
                    assert ok.status == 303
                    cookie = ok.headers["Set-Cookie"]
                    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
                    assert ("Secure" in cookie) is secure
                    assert cookie.startswith("__Host-jobtui=" if secure else "jobtui=")
                bad = {**form, "password": "wrong-password-here"}
                async with client.post(f"{server.url}/login", data=bad, headers=headers) as refused:
                    assert refused.status == 401
            assert server.said(f"failed sign-in as 'alice' from {client_address}")
        finally:
            server.stop()


def jobtui(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str, stdin: str = ""
) -> tuple[int, str, str]:
    """`jobtui ARGS` in this process, with `stdin` as its standard input: exit code, out, err."""
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_network_and_users_file_defaults_refuse_what_is_unsafe(
    dsn: str, users: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JOBTUI_DSN", dsn)
    cases = [
        (["serve", "--users", str(users), "--addr", "0.0.0.0"], "refusing to serve plain HTTP on 0.0.0.0"),
        (["serve", "--users", str(users), "--addr", "db.example.com"], "refusing to serve plain HTTP on db.example"),
        (["serve", "--users", str(users), "--cert", str(users)], "give --cert and --key together"),
        (["serve", "--users", str(tmp_path / "none")], "no users in"),
        (["serve", "--users", str(users), "--trusted-proxy", "proxy.example"], "is not an address or network"),
        (["--work", "tests.apps.worker_app:jobs", "serve", "--users", str(users)], "does not: run `jobtui worker`"),
    ]
    for args, said in cases:
        code, _, err = jobtui(capsys, monkeypatch, *args)
        assert code == 2, (args, err)
        assert said in err and err.count("\n") == 1, err
    users.chmod(0o644)
    code, _, err = jobtui(capsys, monkeypatch, "serve", "--users", str(users))
    assert code == 2 and "chmod 600" in err


def test_user_add_list_and_remove(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "conf" / "users")
    # As a script adds one: the password on standard input, through a pipe.
    added = subprocess.run(
        [sys.executable, "-m", "jobtui.cli", "user", "add", "carol", "--operator", "--users", path],
        input="carol-password-1\n", capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert "added as operator" in added.stdout
    assert (Path(path).stat().st_mode & 0o777) == 0o600
    text = Path(path).read_text()
    assert "carol:operator:$argon2id$" in text and "carol-password-1" not in text
    assert jobtui(capsys, monkeypatch, "user", "add", "dave", "--users", path, stdin="dave-password-12\n")[0] == 0
    assert jobtui(capsys, monkeypatch, "user", "list", "--users", path)[1].split() == [
        "carol",
        "operator",
        "dave",
        "viewer",
    ]
    for args, stdin, said in (
        (["add", "carol"], "another-password", "exists: give --replace"),
        (["add", "erin"], "short", "at least 12 characters"),
        (["add", "bad:name"], "long-enough-password", "is not allowed"),
        (["remove", "nobody"], "", "no user 'nobody'"),
    ):
        code, _, err = jobtui(capsys, monkeypatch, "user", *args, "--users", path, stdin=stdin)
        assert code == 2 and said in err, err
    assert jobtui(capsys, monkeypatch, "user", "remove", "dave", "--users", path)[0] == 0
    assert jobtui(capsys, monkeypatch, "user", "list", "--users", path)[1].split() == ["carol", "operator"]


async def test_consoles_end_when_their_server_is_killed(dsn: str, users: Path, viewer_dsn: str) -> None:
    server = ServeProcess(dsn, users, viewer_dsn=viewer_dsn)
    try:
        async with await signed_in(server.url, "bob") as client:
            _console, _ = await started_console(client, server.url)
            pids = server.consoles()
            assert len(pids) == 1
            server.proc.kill()  # no chance to ask its consoles to quit
            server.proc.wait(10)
            wait_until(lambda: not Path(f"/proc/{pids[0]}").exists(), 15, "the orphaned console to end")
            wait_until(lambda: console_connections(dsn, "bob") == 0, 10, "its database connection closed")
    finally:
        server.stop()


async def test_a_console_that_cannot_start_says_why_in_the_tab(dsn: str, server: ServeProcess) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER SCHEMA jobtui RENAME TO jobtui_elsewhere")  # as a failed deploy might leave it
    async with await signed_in(server.url, "alice") as client:
        console = await open_console(client, server.url)
        assert await console.until_closed() == 1000
    said = console.screen.text()
    assert "jobtui serve: the console did not start: jobtui: error: schema 'jobtui' is missing" in said
    assert server.consoles() == []


async def test_a_linked_view_goes_through_the_sign_in_and_opens_the_console_there(
    dsn: str, server: ServeProcess
) -> None:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as client:
        async with client.get(f"{server.url}/?open=job:7", allow_redirects=False) as answer:
            assert (answer.status, unquote(answer.headers["Location"])) == (303, "/login?open=job:7")
        async with client.get(f"{server.url}/login?open=job%3A7") as answer:
            assert '<input type="hidden" name="open" value="job:7">' in await answer.text()
        # A view the console does not have is not carried (nor any other text a link holds).
        for bad in ("https://evil.example/", "job:x", "dead:", "a" * 300):
            async with client.get(f"{server.url}/", params={"open": bad}, allow_redirects=False) as answer:
                assert answer.headers["Location"] == "/login", bad
        form = {"name": "bob", "password": PASSWORDS["bob"], "open": "queue:reports"}
        async with client.post(
            f"{server.url}/login", data=form, headers={"Origin": server.url}, allow_redirects=False
        ) as answer:
            assert (answer.status, unquote(answer.headers["Location"])) == (303, "/?open=queue:reports")
        async with client.get(f"{server.url}/?open=queue%3Areports") as answer:
            assert 'data-session-websocket-url="ws://' in (page := await answer.text())
            assert "/ws/queue%3Areports" in page
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO jobtui.job (type, queue) VALUES ('report.build', 'reports')")
    async with await signed_in(server.url, "bob") as client:
        ws = server.url.replace("http", "ws", 1) + "/ws/queue%3Areports?width=160&height=40"
        socket = await client.ws_connect(ws, headers={"Origin": server.url})
        await socket.send_str('["resize", {"width": 160, "height": 40}]')
        from tests.web import ProtocolConsole

        console = ProtocolConsole(socket, 160, 40)
        # The panes draw before the first read fills the header: wait for both.
        screen = await console.wait(
            "the Queues pane, read", lambda s: "forecast" in s and "read-only console" in s and "reports" in s
        )
        assert "oldest ready" in screen
        await socket.close()


def test_serve_registers_in_the_fleet_and_a_stop_ends_it(dsn: str, users: Path, viewer_dsn: str) -> None:
    from jobtui.reads.fleet import read_fleet

    serve = ServeProcess(dsn, users, viewer_dsn=viewer_dsn)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            wait_until(lambda: read_fleet(conn).processes, 10, "serve's row", serve.log)
            [p] = read_fleet(conn).processes
            assert (p.kind, p.pid, p.metrics) == ("serve", serve.proc.pid, f"{serve.url}/")
            assert main(["--dsn", dsn, "workers", "quiet", p.name]) == 2  # it claims nothing
            assert main(["--dsn", dsn, "workers", "stop", p.name]) == 0
            assert serve.proc.wait(20) == 0
            assert read_fleet(conn).processes == []
    finally:
        serve.stop()
