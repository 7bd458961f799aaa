"""Fleet-wide rates of queues and job types, and resumes that ramp, against real PostgreSQL:
the claim statement takes a token of a rated queue's or type's bucket per job, across every
claim, and leaves the jobs of unrated queues to the claim as it was."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from jobtui.clients.client import Client
from jobtui.core import queues
from jobtui.core.claims import claim_call
from jobtui.kernel.db import run
from jobtui.kernel.domain import NewJob
from jobtui.kernel.errors import InvalidInput
from jobtui.kernel.rates import parse_rate
from jobtui.reads.overview import overview
from jobtui.service.prometheus import serve
from tests.conftest import rows_read
from tests.integration.test_levers import jobtui
from tests.integration.test_metrics import free_port, scrape
from tests.waits import hold, wait_until
from tests.workers import WorkerProcess

Conn = psycopg.Connection[Any]
Spawn = Callable[..., WorkerProcess]


def claim(conn: Conn, queue: str | None = None, limit: int = 50, types: tuple[str, ...] = ("a", "b")) -> list[int]:
    return [j.id for j in run(conn, claim_call(types, worker="w", limit=limit, queue=queue))]


def claim_later(
    conn: Conn, seconds: float, queue: str | None = None, limit: int = 50, types: tuple[str, ...] = ("a", "b")
) -> list[int]:
    """Claim as if exactly `seconds` had passed since each bucket's last refill, by the
    database's clock: the refills, and the ramps with them, move back in the claim's own
    transaction, whose now() is the claim's. Moving the data keeps the count exact however
    slow the machine is, where sleeping would add its delays to the time."""
    with conn.transaction():
        conn.execute(
            "UPDATE jobtui.queue_control AS c"
            " SET ramp_from = c.ramp_from - (make_interval(secs => %(s)s) - (now() - b.refilled_at)),"
            " ramp_until = c.ramp_until - (make_interval(secs => %(s)s) - (now() - b.refilled_at))"
            " FROM jobtui.rate_bucket AS b WHERE (b.kind, b.name) = (c.kind, c.name) AND c.ramp_until IS NOT NULL",
            {"s": seconds},
        )
        conn.execute("UPDATE jobtui.rate_bucket SET refilled_at = now() - make_interval(secs => %s)", (seconds,))
        return claim(conn, queue, limit, types)


def fill(dsn: str, n: int, job_type: str = "a", queue: str = "default") -> list[int]:
    with Client(dsn) as q:
        return [q.enqueue(job_type, queue=queue) for _ in range(n)]


def test_a_rated_type_gets_a_token_per_job_and_the_rest_flows(conn: Conn, dsn: str) -> None:
    rated = fill(dsn, 40, "a")
    free = fill(dsn, 5, "b")
    assert queues.set_rate(conn, "type", "a", 10.0, actor="olga").was is None
    first = claim_later(conn, 0.0)  # at once: no time for a slow machine to add tokens
    # The bucket starts with one token; the unrated type's jobs all come at once.
    assert sorted(j for j in first if j in free) == free
    assert len([j for j in first if j in rated]) == 1
    assert len(claim_later(conn, 0.45, types=("a",))) == 4  # 4.5 tokens: 4 jobs, half a token kept
    assert len(claim_later(conn, 0.6, types=("a",))) == 6  # the half and 6 more
    assert len(claim_later(conn, 0.0, types=("a",))) == 0  # the half is not a job
    line = next(q for q in overview(conn).lines if (q.kind, q.name) == ("type", "a"))
    assert (line.rate, line.rate_now, line.ramp_until) == (10.0, 10.0, None)


def test_a_rate_change_holds_from_the_next_claim(conn: Conn, dsn: str) -> None:
    fill(dsn, 100, "a", queue="api")
    queues.set_rate(conn, "queue", "api", 2.0, actor="olga")
    claim_later(conn, 0.0)  # the first token
    assert len(claim_later(conn, 0.5)) == 1  # half a second at 2/s
    change = queues.set_rate(conn, "queue", "api", 40.0, actor="olga", expected=2.0, fenced=True)
    assert change.changed and change.was == 2.0
    assert 18 <= len(claim_later(conn, 0.5)) <= 22  # half a second at 40/s, and no burst from the change
    # Fenced by the rate the operator saw: it is 40 now.
    assert not queues.set_rate(conn, "queue", "api", 1.0, actor="olga", expected=2.0, fenced=True).changed
    queues.set_rate(conn, "queue", "api", None, actor="olga")
    assert len(claim(conn, limit=100)) >= 50  # no rate: the rest at once
    audit = conn.execute("SELECT action, target, rows, detail FROM jobtui.audit ORDER BY id").fetchall()
    assert [(a, t, r) for a, t, r, _ in audit] == [
        ("queue-rate", "queue api", 1),
        ("queue-rate", "queue api", 1),
        ("queue-rate", "queue api", 0),
        ("queue-rate", "queue api", 1),
    ]
    assert audit[1][3] == {"rate_per_second": 40.0, "was": 2.0}


def test_a_job_takes_a_token_of_its_queue_and_of_its_type(conn: Conn, dsn: str) -> None:
    in_both = fill(dsn, 10, "a", queue="api")
    other_type = fill(dsn, 10, "b", queue="api")
    queues.set_rate(conn, "queue", "api", 1.0, actor="olga")
    queues.set_rate(conn, "type", "a", 1.0, actor="olga")
    # Each bucket holds one token: the queue's goes to the oldest job, which also takes its
    # type's. Nothing else of the queue may go now.
    assert claim(conn) == [in_both[0]]
    assert claim(conn) == []
    queues.set_rate(conn, "queue", "api", None, actor="olga")
    got = claim_later(conn, 1.05)
    assert sorted(got) == [in_both[1], *other_type]


def test_a_rated_type_in_a_limited_queue_holds_to_both(conn: Conn, dsn: str) -> None:
    ids = fill(dsn, 20, "a", queue="lim")
    plain = fill(dsn, 5, "b", queue="lim")
    queues.set_limit(conn, "lim", 3, actor="olga")
    queues.set_rate(conn, "type", "a", 1000.0, actor="olga")
    # The bucket holds 50 tokens by now; the queue's limit lets three run, counted together.
    assert sorted(claim_later(conn, 0.05)) == ids[:3]
    assert claim(conn) == []
    conn.execute("UPDATE jobtui.job SET status = 'done', locked_until = NULL WHERE id = %s", (ids[0],))
    queues.set_rate(conn, "type", "a", None, actor="olga")
    assert claim(conn) == [ids[3]]  # one slot freed, for the oldest job of the queue
    queues.set_rate(conn, "type", "a", 0.001, actor="olga")  # its bucket keeps one token
    conn.execute("UPDATE jobtui.job SET status = 'done', locked_until = NULL WHERE id = ANY(%s)", (ids[1:3],))
    assert sorted(claim(conn)) == [ids[4], plain[0]]  # the token, then the other type
    n = conn.execute("SELECT count(*) FROM jobtui.job WHERE queue = 'lim' AND status = 'running'").fetchone()
    assert n == (3,)


def test_a_paused_rated_queue_stays_paused(conn: Conn, dsn: str) -> None:
    fill(dsn, 5, "a", queue="api")
    queues.set_rate(conn, "queue", "api", 100.0, actor="olga")
    queues.pause(conn, "queue", "api", actor="olga")
    assert claim_later(conn, 0.1) == []  # ten tokens, and the pause holds
    queues.pause(conn, "type", "a", actor="olga")
    queues.resume(conn, "queue", "api", actor="olga")
    assert claim(conn) == []  # the type is paused


def test_a_ramp_starts_slow_and_ends_at_the_rate(conn: Conn, dsn: str) -> None:
    fill(dsn, 300, "a", queue="api")
    queues.pause(conn, "queue", "api", actor="olga")
    queues.set_rate(conn, "queue", "api", 100.0, actor="olga")
    assert queues.resume(conn, "queue", "api", actor="olga", ramp=2.0)
    line = next(q for q in overview(conn).lines if q.name == "api")
    assert line.ramping and line.rate == 100.0 and line.rate_now is not None and line.rate_now < 2.0
    early = len(claim_later(conn, 0.5))
    # 1.6 s later (the claim that took nothing left the bucket's refill at the resume): the
    # bucket at its fullest is two seconds' worth.
    claim_later(conn, 2.1)
    late = len(claim_later(conn, 0.5))
    # From 1/s, ten times as fast per half of the ramp: the first half second lets in about
    # one job (0.9 tokens at the rate of its middle, 1.8/s), the last (past the ramp) 50.
    assert early == 0 and late == 50, (early, late)
    assert next(q for q in overview(conn).lines if q.name == "api").ramp_until is None
    detail = conn.execute("SELECT detail FROM jobtui.audit WHERE action = 'queue-resume'").fetchone()
    assert detail == ({"ramp_seconds": 2.0},)


def test_the_rate_of_a_bucket_is_worked_out_inside_the_claims_own_statements(conn: Conn) -> None:
    # A rated claim works a bucket's tokens out twice or three times (bucket_tokens, which
    # calls control_rate twice); each call of an SQL function PostgreSQL cannot inline runs
    # a query of its own. The plan names no function: all of it is inlined.
    plan = conn.execute(
        "EXPLAIN (VERBOSE) SELECT jobtui.bucket_tokens(b.tokens, b.refilled_at, 5.0,"
        " now() - interval '1 minute', now() + interval '1 minute') FROM jobtui.rate_bucket AS b"
    ).fetchall()
    output = " ".join(row[0] for row in plan)
    assert "power(" in output and "control_rate" not in output and "ramp_share" not in output
    # The rate as migration 0013 defined it: from 1 job/s (or the rate, when lower) up tenfold
    # in equal steps to the rate (10,000/s without one), the rate itself outside the ramp.
    ramp = "timestamptz '2026-01-01', timestamptz '2026-01-01 00:10:00'"
    cases = {
        f"100, {ramp}, timestamptz '2025-12-31'": 1.0,
        f"100, {ramp}, timestamptz '2026-01-01 00:05:00'": 10.0,
        f"100, {ramp}, timestamptz '2026-01-01 00:10:00'": 100.0,
        f"0.25, {ramp}, timestamptz '2026-01-01 00:05:00'": 0.25,
        f"NULL, {ramp}, timestamptz '2026-01-01 00:05:00'": 100.0,
        f"NULL, {ramp}, timestamptz '2026-01-01 00:10:00'": None,
        "7, NULL, NULL, now()": 7.0,
    }
    for args, rate in cases.items():
        got = conn.execute(f"SELECT jobtui.control_rate({args})").fetchone()
        assert got is not None
        assert got[0] == pytest.approx(rate) if rate is not None else got[0] is None, (args, got)


def test_bad_rates_are_refused_in_one_line(conn: Conn) -> None:
    for text in ("fast", "20", "20/week", "-1/s", "0/s", "2000000/s"):
        with pytest.raises(InvalidInput) as err:
            parse_rate(text)
        assert "\n" not in str(err.value)
    with pytest.raises(InvalidInput, match="ramp"):
        queues.resume(conn, "queue", "q", actor="olga", ramp=0)
    assert parse_rate("1200/min") == 20.0


# -- the commands -------------------------------------------------------------------------


def rates_set(conn: Conn) -> list[tuple[str, str, float]]:
    rows = conn.execute(
        "SELECT kind, name, rate_per_second FROM jobtui.queue_control WHERE rate_per_second IS NOT NULL"
        " ORDER BY kind, name"
    ).fetchall()
    return [(str(k), str(n), float(r)) for k, n, r in rows]


def audit_rows(conn: Conn) -> list[tuple[Any, ...]]:
    return list(conn.execute("SELECT actor, action, target, rows, detail FROM jobtui.audit ORDER BY id").fetchall())


def rated_of(samples: dict[Any, float]) -> dict[Any, float]:
    """The rate limits in a scrape, by their labels."""
    return {labels: v for (name, labels), v in samples.items() if name == "jobtui_rate_limit_per_second"}


def said(dsn: str, *args: str) -> str:
    """What a command that succeeds prints (nothing on stderr)."""
    out = jobtui(dsn, *args)
    assert (out.returncode, out.stderr) == (0, ""), out
    return out.stdout


def test_queue_rate_and_type_rate_say_the_rate_they_replaced(conn: Conn, dsn: str) -> None:
    assert said(dsn, "queue", "rate", "api", "20/s") == "queue 'api' rate: 20/s across every worker (was none)\n"
    assert rates_set(conn) == [("queue", "api", 20.0)]
    assert said(dsn, "queue", "rate", "api", "90/min") == "queue 'api' rate: 1.5/s across every worker (was 20/s)\n"
    assert rates_set(conn) == [("queue", "api", 1.5)]
    typed = said(dsn, "type", "rate", "sms.send", "30/h")
    assert typed == "type 'sms.send' rate: 30/h across every worker (was none)\n"
    assert said(dsn, "queue", "rate", "api", "none") == "queue 'api' rate: none (was 1.5/s)\n"
    assert rates_set(conn) == [("type", "sms.send", 30 / 3600)]
    assert said(dsn, "queue", "rate", "api", "none") == "queue 'api' rate: none (was none)\n"
    assert [row[:4] for row in audit_rows(conn)] == [
        ("olga", "queue-rate", "queue api", 1),
        ("olga", "queue-rate", "queue api", 1),
        ("olga", "type-rate", "type sms.send", 1),
        ("olga", "queue-rate", "queue api", 1),
        ("olga", "queue-rate", "queue api", 1),
    ]
    assert audit_rows(conn)[1][4] == {"rate_per_second": 1.5, "was": 20.0}
    assert audit_rows(conn)[3][4] == {"rate_per_second": None, "was": 1.5}


@pytest.mark.parametrize(
    ("given", "why"),
    [
        ("fast", "write it like 20/s, 1200/min or 30/h (or none)"),
        ("20", "write it like 20/s"),
        ("20/week", "write it like 20/s"),
        ("1,5/s", "write it like 20/s"),
        ("0/s", "below 1 job every 10 hours: pause the queue instead"),
        ("2000000/s", "over 1,000,000/s: give none for no rate"),
    ],
)
def test_a_bad_rate_is_one_line_and_changes_nothing(conn: Conn, dsn: str, given: str, why: str) -> None:
    said(dsn, "queue", "rate", "api", "20/s")
    before = audit_rows(conn)
    for kind, name in (("queue", "api"), ("type", "sms.send")):
        out = jobtui(dsn, kind, "rate", name, given)
        assert out.returncode == 2 and out.stdout == "", out
        assert out.stderr.count("\n") == 1 and out.stderr.startswith("jobtui: error: argument rate: "), out.stderr
        assert f"'{given}'" in out.stderr and why in out.stderr, out.stderr
    assert rates_set(conn) == [("queue", "api", 20.0)]
    assert audit_rows(conn) == before


def test_read_only_refuses_every_lever_and_changes_nothing(conn: Conn, dsn: str) -> None:
    said(dsn, "queue", "rate", "api", "20/s")
    said(dsn, "queue", "pause", "reports")
    before = audit_rows(conn)
    for args in (
        ("queue", "rate", "api", "5/s"),
        ("queue", "rate", "api", "none"),
        ("type", "rate", "sms.send", "1/s"),
        ("queue", "limit", "api", "3"),
        ("queue", "pause", "api"),
        ("queue", "resume", "reports", "--ramp", "10s"),
        ("type", "resume", "sms.send"),
    ):
        out = jobtui(dsn, "--read-only", *args)
        assert out.returncode == 2 and out.stdout == "", (args, out)
        what = f"{args[0]} {args[1]}"
        assert out.stderr.startswith(
            f"jobtui: error: `jobtui {what}` changes the database, which --read-only forbids"
        ), out.stderr
        assert out.stderr.count("\n") == 1, out.stderr
    assert rates_set(conn) == [("queue", "api", 20.0)]
    control = conn.execute(
        "SELECT kind, name, paused_at IS NOT NULL, max_running FROM jobtui.queue_control ORDER BY kind, name"
    ).fetchall()
    assert control == [("queue", "api", False, None), ("queue", "reports", True, None)]
    assert audit_rows(conn) == before
    # Without it, the same command changes the rate.
    assert said(dsn, "queue", "rate", "api", "5/s") == "queue 'api' rate: 5/s across every worker (was 20/s)\n"


def table_row(text: str, kind: str, name: str) -> dict[str, str]:
    """A row of a printed `Queues and job types` table, by column."""
    lines = text.splitlines()
    header = next([c.strip() for c in row.split("┃")[1:-1]] for row in lines if "┃ kind " in row)
    cells = next(r for r in ([c.strip() for c in row.split("│")[1:-1]] for row in lines) if r[:2] == [kind, name])
    return dict(zip(header, cells, strict=True))


def test_a_rate_shows_in_queue_list_stats_and_prometheus(conn: Conn, dsn: str) -> None:
    with Client(dsn) as q:
        q.enqueue("sms.send", queue="api")
        q.enqueue("b")
    said(dsn, "queue", "rate", "api", "20/s")
    said(dsn, "type", "rate", "sms.send", "90/min")
    for args in (("queue", "list"), ("stats",)):
        text = said(dsn, *args)
        assert table_row(text, "queue", "api")["rate"] == "20/s", text
        assert table_row(text, "type", "sms.send")["rate"] == "1.5/s", text
        assert table_row(text, "queue", "default")["rate"] == "-", text
    listed = json.loads(said(dsn, "queue", "list", "--json"))
    in_stats = json.loads(said(dsn, "stats", "--json"))["queues"]
    for lines in (listed, in_stats):
        by_name = {(q["kind"], q["name"]): q for q in lines}
        assert (by_name["queue", "api"]["rate"], by_name["queue", "api"]["rate_now"]) == (20.0, 20.0)
        assert (by_name["type", "sms.send"]["rate"], by_name["type", "sms.send"]["rate_now"]) == (1.5, 1.5)
        assert by_name["queue", "default"]["rate"] is None and not by_name["queue", "api"]["ramping"]
    port = free_port()
    server = serve(dsn, port, addr="127.0.0.1")
    try:
        samples = scrape(port)
        rated = rated_of(samples)
        assert rated == {(("kind", "queue"), ("name", "api")): 20.0, (("kind", "type"), ("name", "sms.send")): 1.5}
        said(dsn, "queue", "rate", "api", "none")
        # Scrapes within a second share one snapshot: a later one shows the change.
        only_set = {(("kind", "type"), ("name", "sms.send")): 1.5}  # set ones only
        wait_until(lambda: rated_of(scrape(port)) == only_set, 10, "a scrape without the cleared rate")
    finally:
        server.shutdown()
        server.server_close()


# -- real workers -------------------------------------------------------------------------


def db_now(conn: Conn) -> datetime:
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def started_between(conn: Conn, since: datetime, until: datetime, job_type: str = "quick") -> int:
    row = conn.execute(
        "SELECT count(*) FROM jobtui.job WHERE type = %s AND started_at >= %s AND started_at < %s",
        (job_type, since, until),
    ).fetchone()
    return int(row[0]) if row else 0


def rate_over(conn: Conn, seconds: float) -> float:
    """Jobs started per second over the next `seconds`, by the database's clock."""
    since = db_now(conn)
    hold(seconds, "the window the fleet's rate is measured over")
    return started_between(conn, since, db_now(conn)) / seconds


def passed(conn: Conn, at: datetime) -> None:
    """Wait until the database's clock, by which the jobs' start times are counted, is past `at`."""
    wait_until(lambda: db_now(conn) > at, (at - db_now(conn)).total_seconds() + 30, f"the database's clock at {at}")


def two_rated_workers(conn: Conn, app_dsn: str, spawn: Spawn, jobs: int) -> list[WorkerProcess]:
    with Client(app_dsn) as q:
        q.enqueue_many([NewJob("quick", {}) for _ in range(jobs)])
    queues.set_rate(conn, "type", "quick", 20.0, actor="olga")
    workers = [spawn(name, "--no-scheduler", "--concurrency", "20", "--verbose") for name in ("A", "B")]
    wait_until(lambda: started_between(conn, db_now(conn) - timedelta(seconds=5), db_now(conn)) >= 20, 20, "jobs run")
    return workers


def test_two_workers_hold_to_20_per_second_and_to_50_from_the_next_claim(db: Conn, app_dsn: str, spawn: Spawn) -> None:
    two_rated_workers(db, app_dsn, spawn, 800)
    rate = rate_over(db, 4.0)
    assert 20 * 0.8 <= rate <= 20 * 1.2, rate
    # Each worker claims at least once a second (its poll): from then on the new rate holds.
    changed = db_now(db)
    assert queues.set_rate(db, "type", "quick", 50.0, actor="olga", expected=20.0, fenced=True).changed
    passed(db, changed + timedelta(seconds=4.2))  # and the claims of the window committed
    after = started_between(db, changed + timedelta(seconds=1.1), changed + timedelta(seconds=4.1)) / 3.0
    assert 50 * 0.8 <= after <= 50 * 1.2, after
    locked_by = db.execute("SELECT DISTINCT locked_by FROM jobtui.job WHERE started_at IS NOT NULL").fetchall()
    assert {str(r[0]) for r in locked_by} == {"A", "B"}


@pytest.mark.slow
def test_two_workers_hold_to_20_per_second_over_30s_windows(db: Conn, app_dsn: str, spawn: Spawn) -> None:
    workers = two_rated_workers(db, app_dsn, spawn, 3000)
    for _ in range(2):
        rate = rate_over(db, 30.0)
        assert 20 * 0.9 <= rate <= 20 * 1.1, rate
    queues.set_rate(db, "type", "quick", 50.0, actor="olga")
    for worker, mark in [(w, w.claims()) for w in workers]:
        worker.wait_claims(mark + 2, 10)  # a claim that takes the new rate (WorkerProcess.claims)
    rate = rate_over(db, 30.0)
    assert 50 * 0.9 <= rate <= 50 * 1.1, rate


def ramp_run(db: Conn, app_dsn: str, spawn: Spawn, jobs: int, ramp: str, seconds: float) -> tuple[int, int]:
    """Jobs started in the first and in the last 5 s of a ramp of a paused queue's backlog."""
    with Client(app_dsn) as q:
        q.enqueue_many([NewJob("quick", {}, queue="bulk") for _ in range(jobs)])
    assert "paused" in jobtui(app_dsn, "queue", "pause", "bulk").stdout
    for name in ("A", "B"):
        spawn(name, "--no-scheduler", "--concurrency", "50")
    out = jobtui(app_dsn, "queue", "resume", "bulk", "--ramp", ramp)
    assert out.returncode == 0 and "rising over" in out.stdout, out
    resumed = db_now(db)
    passed(db, resumed + timedelta(seconds=seconds + 0.5))  # and the claims of the window committed
    first = started_between(db, resumed, resumed + timedelta(seconds=5))
    last = started_between(db, resumed + timedelta(seconds=seconds - 5), resumed + timedelta(seconds=seconds))
    return first, last


def test_a_resume_with_a_ramp_lets_the_backlog_in_slowly_at_first(db: Conn, app_dsn: str, spawn: Spawn) -> None:
    first, last = ramp_run(db, app_dsn, spawn, 3000, "10s", 10.0)
    assert last > 0 and first < last / 3, (first, last)


@pytest.mark.slow
def test_a_30s_ramp_over_20000_ready_jobs(db: Conn, app_dsn: str, spawn: Spawn) -> None:
    first, last = ramp_run(db, app_dsn, spawn, 20_000, "30s", 30.0)
    assert last > 0 and first < last / 3, (first, last)


def test_a_rated_queue_without_due_jobs_costs_the_claim_a_few_rows(conn: Conn, dsn: str) -> None:
    """A rate elsewhere must not make every claim read the whole backlog of the others."""
    with Client(dsn) as q:
        q.enqueue_many([NewJob("a", {}) for _ in range(5000)])
    conn.execute("VACUUM ANALYZE jobtui.job")
    queues.set_rate(conn, "queue", "idle", 5.0, actor="olga")
    with conn.transaction():
        assert len(claim(conn, limit=10)) == 10
        row = conn.execute(
            "SELECT coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0) FROM pg_stat_xact_user_tables"
            " WHERE schemaname = 'jobtui' AND relname = 'job'"
        ).fetchone()
    assert row is not None and row[0] < 200, row  # the claim's own rows and the rated part's first ones


@pytest.mark.parametrize("kind", ["type", "queue"])
def test_a_spent_bucket_costs_its_own_workers_claims_a_few_rows_however_long_its_backlog(
    conn: Conn, dsn: str, kind: queues.Kind
) -> None:
    """A worker serving only a rated type (or queue) whose bucket is spent must not read that
    type's whole backlog at every claim, looking for jobs that no rate holds back."""
    conn.execute("INSERT INTO jobtui.job (type, queue, payload) SELECT 'a', 'api', '{}' FROM generate_series(1, 20000)")
    conn.execute("VACUUM ANALYZE jobtui.job")
    queues.set_rate(conn, kind, "a" if kind == "type" else "api", 0.001, actor="olga")
    queue = "api" if kind == "queue" else None
    assert len(claim(conn, queue, types=("a",))) == 1  # the bucket's one token
    with conn.transaction():
        assert claim(conn, queue, types=("a",)) == []
        assert rows_read(conn) < 1000  # a few rounds over the rated part's first jobs, not 20,000


def test_a_rated_job_is_not_held_back_by_the_backlog_of_a_paused_type_ahead_of_it(conn: Conn, dsn: str) -> None:
    fill(dsn, 100, "a")
    queues.pause(conn, "type", "a", actor="olga")
    rated = fill(dsn, 5, "b")
    queues.set_rate(conn, "type", "b", 1000.0, actor="olga")
    assert sorted(claim_later(conn, 0.05, limit=10)) == rated


def test_a_rated_job_is_not_held_back_by_another_rated_types_spent_backlog(conn: Conn, dsn: str) -> None:
    fill(dsn, 100, "a")
    queues.set_rate(conn, "type", "a", 0.001, actor="olga")
    assert len(claim(conn, types=("a",))) == 1  # a's one token
    rated = fill(dsn, 5, "b")
    queues.set_rate(conn, "type", "b", 1000.0, actor="olga")
    assert sorted(claim_later(conn, 0.05, limit=10)) == rated


def test_a_claim_under_the_same_buckets_throughout_takes_what_the_emptiest_allows(conn: Conn, dsn: str) -> None:
    """Every job of a claim of the rated queue `api` for the rated type `a` takes a token of
    both buckets: the claim takes as many as the emptier holds, charges both, and reads no
    more jobs than it takes."""
    conn.execute("INSERT INTO jobtui.job (type, queue, payload) SELECT 'a', 'api', '{}' FROM generate_series(1, 5000)")
    conn.execute("VACUUM ANALYZE jobtui.job")
    oldest = [int(r[0]) for r in conn.execute("SELECT id FROM jobtui.job ORDER BY id LIMIT 2")]  # one run_at
    queues.set_rate(conn, "queue", "api", 3.0, actor="olga")
    queues.set_rate(conn, "type", "a", 2.0, actor="olga")
    conn.execute(
        "INSERT INTO jobtui.rate_bucket (kind, name, tokens, refilled_at) VALUES"
        " ('queue', 'api', 0, now()), ('type', 'a', 0, now())"
        " ON CONFLICT (kind, name) DO UPDATE SET tokens = 0"
    )
    with conn.transaction():
        assert sorted(claim_later(conn, 1.0, "api", types=("a",))) == oldest  # 3 and 2 tokens: 2 jobs
        assert rows_read(conn) < 50
    left = dict(conn.execute("SELECT kind, tokens FROM jobtui.rate_bucket").fetchall())
    assert left == {"queue": pytest.approx(1.0), "type": pytest.approx(0.0)}
