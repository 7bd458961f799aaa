"""Finding jobs by payload against real PostgreSQL: JSON containment over every status,
newest first, in keyset pages, read window by window (with progress, and a stop) or through
the optional GIN index, from both clients, the CLI and a statement timeout."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import psycopg
import pytest

from jobtui import AsyncClient, Client, JobFilter, SearchCancelled
from jobtui.kernel.domain import NewJob
from jobtui.kernel.errors import InvalidInput
from jobtui.kernel.jobfilter import parse_filter, payload_of
from jobtui.reads import jobquery
from jobtui.reads.jobquery import search, search_count
from tests.integration.test_levers import jobtui

Conn = psycopg.Connection[Any]


def mixed(dsn: str, conn: Conn) -> dict[str, list[int]]:
    """Jobs of accounts acme and other, acme's in every status."""
    with Client(dsn) as q:
        ids = q.enqueue_many(
            [
                NewJob("a", {"account": "acme" if i % 3 == 0 else "other", "n": i, "user": {"plan": "pro"}})
                for i in range(60)
            ]
        )
    acme = [i for n, i in enumerate(ids) if n % 3 == 0]
    for status, chosen in (("done", acme[0:2]), ("dead", acme[2:4]), ("failed", acme[4:5])):
        conn.execute(
            "UPDATE jobtui.job SET status = %s, finished_at = now(), attempts = 1 WHERE id = ANY(%s)", (status, chosen)
        )
    conn.execute(
        "UPDATE jobtui.job SET status = 'running', locked_until = now() + interval '1 minute', locked_by = 'w'"
        " WHERE id = ANY(%s)",
        (acme[5:6],),
    )
    return {"acme": acme, "all": ids}


def test_jobs_by_payload_over_every_status_newest_first_in_pages(
    conn: Conn, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = mixed(dsn, conn)
    acme = found["acme"]
    monkeypatch.setattr(jobquery, "FIRST_WINDOW", 4)  # many small windows
    with Client(dsn) as q:
        page = q.jobs(payload={"account": "acme"}, limit=8)
        assert [j.id for j in page] == sorted(acme, reverse=True)[:8]
        assert {j.status.value for j in q.jobs(payload={"account": "acme"}, limit=100)} == {
            "ready", "running", "done", "dead", "failed",
        }  # fmt: skip
        older = q.jobs(payload={"account": "acme"}, limit=8, before=page[-1].id)
        assert [j.id for j in older] == sorted(acme, reverse=True)[8:16]
        assert [j.id for j in q.jobs(payload={"account": "acme"}, status="dead")] == sorted(acme[2:4], reverse=True)
        assert len(q.jobs(payload={"user": {"plan": "pro"}}, limit=100)) == 60  # nested containment
        result = q.search(JobFilter(payload={"account": "acme"}), limit=5)
    assert len(result.jobs) == 5 and result.more and not result.complete
    assert result.said() == "5 of at least 6"
    steps: list[tuple[float, int]] = []
    everything = search(
        conn, JobFilter(payload={"account": "acme"}), limit=100, progress=lambda d, n: steps.append((d, n))
    )
    assert everything.complete and everything.said() == f"{len(acme)} of {len(acme)}"
    assert len(steps) > 3 and steps[-1] == (1.0, len(acme)) and [d for d, _ in steps] == sorted(d for d, _ in steps)
    counts = search_count(conn, JobFilter(payload={"account": "acme"}))
    assert sum(c.jobs for c in counts) == len(acme)


def test_the_async_client_finds_the_same(conn: Conn, dsn: str) -> None:
    found = mixed(dsn, conn)

    async def main() -> list[int]:
        async with AsyncClient(dsn) as q:
            return [j.id for j in await q.jobs(payload={"account": "acme"}, limit=100)]

    assert asyncio.run(main()) == sorted(found["acme"], reverse=True)


def test_a_search_stops_when_asked_and_at_its_statement_timeout(
    conn: Conn, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    mixed(dsn, conn)
    monkeypatch.setattr(jobquery, "FIRST_WINDOW", 2)
    stop = threading.Event()

    def halfway(done: float, found: int) -> None:
        if done > 0.3:
            stop.set()

    with pytest.raises(SearchCancelled, match="cancelled at") as err:
        search(conn, JobFilter(payload={"account": "nobody"}), progress=halfway, stop=stop)
    assert 0.3 < err.value.scanned < 1.0
    # A window that waits (here behind a table lock) past the timeout is ended by the server.
    with psycopg.connect(dsn) as locker:
        locker.execute("LOCK TABLE jobtui.job IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(SearchCancelled, match="statement timeout"):
            search(conn, JobFilter(payload={"account": "nobody"}), timeout=0.3)
    assert conn.execute("SHOW statement_timeout").fetchone() == ("0",)  # the timeout was the transaction's


def test_the_payload_index_serves_the_search_in_one_window(conn: Conn, dsn: str) -> None:
    found = mixed(dsn, conn)
    out = jobtui(dsn, "index", "payload")
    assert out.returncode == 0 and "is built" in out.stdout, out
    assert "nothing to do" in jobtui(dsn, "index", "payload").stdout
    result = search(conn, JobFilter(payload={"account": "acme"}), limit=100)
    assert result.indexed and result.complete and [j.id for j in result.jobs] == sorted(found["acme"], reverse=True)
    plan = conn.execute('EXPLAIN SELECT id FROM jobtui.job WHERE payload @> \'{"account": "acme"}\'::jsonb').fetchall()
    assert "job_payload_idx" in str(plan) or "Seq Scan" in str(plan)  # a tiny table may be read whole
    actions = [r[0] for r in conn.execute("SELECT action FROM jobtui.audit ORDER BY id").fetchall()]
    assert actions == ["index-create"]
    assert "dropped" in jobtui(dsn, "index", "payload", "--drop").stdout


def test_jobs_by_payload_from_the_shell(conn: Conn, dsn: str) -> None:
    found = mixed(dsn, conn)
    shown = jobtui(dsn, "jobs", "--payload-path", "account=acme", "--limit", "5")
    assert shown.returncode == 0, shown
    assert "5 of at least 6 matching" in shown.stdout and "--before" in shown.stdout
    listed = json.loads(jobtui(dsn, "jobs", "--payload", '{"account": "acme"}', "--status", "dead", "--json").stdout)
    assert [j["id"] for j in listed["jobs"]] == sorted(found["acme"][2:4], reverse=True) and listed["complete"]
    counted = json.loads(jobtui(dsn, "jobs", "--payload-path", "account=acme", "--count", "--json").stdout)
    assert sum(c["jobs"] for c in counted) == len(found["acme"])
    for args, says in (
        (("--payload", "{nope"), "not valid JSON"),
        (("--payload", "[1]"), "JSON object"),
        (("--payload-path", "account"), "KEY=VALUE"),
        (("--payload-path", "a=1", "--payload-path", "a=2"), "given twice"),
    ):
        result = jobtui(dsn, "jobs", *args)
        assert result.returncode == 2 and says in result.stderr and len(result.stderr.strip().splitlines()) == 1, (
            args,
            result,
        )


def test_the_consoles_filter_words() -> None:
    f = parse_filter("payload:account=acme payload:user.plan=pro status:dead,failed type:t queue:q older:1h")
    assert f.payload == {"account": "acme", "user": {"plan": "pro"}}
    assert (f.statuses, f.types, f.queue, f.older_than) == (("dead", "failed"), ("t",), "q", 3600.0)
    assert parse_filter('payload:{"a": [1]}').payload == {"a": [1]}
    assert payload_of(None, ["n=42", 'code="007"']) == {"n": 42, "code": "007"}
    for bad in ("nope", "status:sleeping", "payload:", "older:soon"):
        with pytest.raises(InvalidInput):
            parse_filter(bad)
