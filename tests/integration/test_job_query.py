"""The job query API: `Client.jobs` and `Client.counts` (and the async client's), and `jobtui
jobs` built on them, against rows whose states the test sets through the queue itself."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

import jobtui
from jobtui import AsyncClient, Client, Failure, InvalidInput, JobStatus, NewJob
from tests import cli
from tests.integration.test_cli import jobtui as run_cli
from tests.integration.test_cli import ok
from tests.integration.test_scheduler import faketime_env


def _fill(queue: Client) -> dict[str, list[int]]:
    """3 ready email.send and 2 ready email.bounce in the queue "mail", 1 ready sms.send and
    1 emailer in the default queue, then 2 of the email.send claimed and failed for good (one
    "smtp 550", one "smtp 421")."""
    ids = queue.enqueue_many(
        [NewJob("email.send", {"n": i}, queue="mail") for i in range(3)]
        + [NewJob("email.bounce", {}, queue="mail") for _ in range(2)]
        + [NewJob("sms.send", {})]
        + [NewJob("emailer", {})]
    )
    claimed = queue.claim(["email.send"], worker="w1", limit=2)
    queue.fail_permanently([c.lease for c in claimed], ["smtp 550 no such user", "smtp 421 try later"])
    return {"all": ids, "failed": sorted(c.id for c in claimed)}


def test_jobs_filter_and_page_newest_first(dsn: str) -> None:
    with Client(dsn) as queue:
        made = _fill(queue)
        everything = queue.jobs()
        assert [j.id for j in everything] == sorted(made["all"], reverse=True)
        failed = queue.jobs(status="failed")
        assert sorted(j.id for j in failed) == made["failed"]
        assert all(j.status is JobStatus.FAILED and j.worker == "w1" and j.finished_at for j in failed)
        assert [j.id for j in queue.jobs(status="failed", error="550")] == [
            j.id for j in failed if j.last_error.startswith("smtp 550")
        ]
        mail = queue.jobs(queue="mail")
        assert {j.type for j in mail} == {"email.send", "email.bounce"} and {j.queue for j in mail} == {"mail"}
        assert {j.type for j in queue.jobs(queue="default")} == {"sms.send", "emailer"}
        assert len(queue.jobs(type=["sms.send", "emailer"])) == 2
        assert queue.jobs(since=datetime.now(UTC) + timedelta(hours=1)) == []
        # Keyset pages: every job once, in order, however the pages fall.
        seen: list[int] = []
        page = queue.jobs(limit=3)
        while page:
            seen += [j.id for j in page]
            page = queue.jobs(limit=3, before=page[-1].id)
        assert seen == [j.id for j in everything]


def test_counts_by_status_and_type(dsn: str) -> None:
    with Client(dsn) as queue:
        _fill(queue)
        counts = {(c.status.value, c.type): c.jobs for c in queue.counts()}
        assert counts == {
            ("ready", "email.send"): 1,
            ("failed", "email.send"): 2,
            ("ready", "email.bounce"): 2,
            ("ready", "sms.send"): 1,
            ("ready", "emailer"): 1,
        }
        assert queue.count(status="ready", queue="mail") == 3
        assert queue.count(status=["failed", "dead"]) == 2
        assert queue.count(type="nothing.here") == 0


def test_bad_query_input_is_one_clear_error(dsn: str) -> None:
    with Client(dsn) as queue:
        with pytest.raises(InvalidInput, match="unknown status"):
            queue.jobs(status="finished")
        with pytest.raises(InvalidInput, match="it is a regular expression"):
            queue.jobs(error="(unclosed")
        with pytest.raises(InvalidInput, match="from 1 to 1000"):
            queue.jobs(limit=0)
        with pytest.raises(TypeError, match="unexpected keyword argument 'statuses'"):
            queue.jobs(statuses="ready")  # type: ignore[call-arg]


async def test_the_async_client_answers_the_same(dsn: str) -> None:
    with Client(dsn) as queue:
        made = _fill(queue)
        expected = queue.jobs(status="failed")
    async with AsyncClient(dsn) as aqueue:
        assert await aqueue.jobs(status="failed") == expected
        assert await aqueue.count(status="failed") == len(made["failed"])
        assert await aqueue.check_schema() == jobtui.kernel.migrate.code_version()


def test_claimed_job_and_handler_job_carry_their_times_and_queue(dsn: str) -> None:
    with Client(dsn) as queue:
        job_id = queue.enqueue("t", {}, delay=0, queue="reports")
        claimed = queue.claim(["t"], worker="w")[0]
        row = queue.get(job_id)
        assert row is not None and (claimed.created_at, claimed.run_at) == (row.created_at, row.run_at)
        job = jobtui.Job(claimed, "w", queue.schema)
        assert (job.created_at, job.run_at) == (row.created_at, row.run_at)
        # A queue is a named queue; the schema is the schema.
        assert (job.queue, job.schema, claimed.queue) == ("reports", "jobtui", "reports")
        queue.fail([Failure(claimed.lease, "x", 0)])


def test_migrate_and_check_for_code_that_deploys_itself(empty_dsn: str) -> None:
    with pytest.raises(jobtui.SchemaNotMigrated):
        jobtui.check_schema(empty_dsn)
    applied = jobtui.migrate_schema(empty_dsn)
    assert applied and applied[0] == "0001_job_queue"
    assert jobtui.migrate_schema(empty_dsn) == []  # nothing left to do
    assert jobtui.check_schema(empty_dsn) == jobtui.kernel.migrate.code_version()
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM jobtui.migration").fetchone() == (len(applied),)


def test_cli_since_goes_by_the_database_clock(dsn: str) -> None:
    """`jobtui jobs --since 1h` on a machine whose clock is 3 hours ahead still lists the job
    enqueued a moment ago, and leaves out one enqueued 2 hours ago, by the database's clock."""
    with Client(dsn) as queue:
        old, new = queue.enqueue_many([NewJob("email.send", {"n": 1}), NewJob("email.send", {"n": 2})])
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE jobtui.job SET created_at = now() - interval '2 hours' WHERE id = %s", (old,))
    ahead = cli.run_cli("jobs", "--since", "1h", "--json", env={**cli.clean_env(dsn), **faketime_env(hours=3)})
    assert [j["id"] for j in json.loads(ok(ahead))] == [new]


def test_cli_lists_and_counts_through_the_api(dsn: str) -> None:
    with Client(dsn) as queue:
        made = _fill(queue)
    listed = json.loads(ok(run_cli(dsn, "jobs", "--status", "failed", "--json")))
    assert sorted(j["id"] for j in listed) == made["failed"]
    counted = json.loads(ok(run_cli(dsn, "jobs", "--count", "--queue", "mail", "--json")))
    assert sum(c["jobs"] for c in counted) == 5
    table = ok(run_cli(dsn, "jobs", "--limit", "2"))
    assert f"--before {sorted(made['all'])[-2]}" in table
    bad = run_cli(dsn, "jobs", "--status", "finished")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "unknown status" in bad.stderr


def test_cli_count_refuses_the_filters_it_cannot_count_by(dsn: str) -> None:
    """`jobs --count` counts by status, type and queue: with --since or --error it says so, in
    one line and exit code 2, rather than printing a number that looks filtered and is not."""
    for extra in (("--since", "1h"), ("--error", "timeout")):
        result = run_cli(dsn, "jobs", "--count", *extra)
        assert result.returncode == 2, result
        assert result.stderr.count("\n") == 1 and "--count counts by --status, --type and --queue only" in result.stderr
        assert result.stdout == ""
    # --before and --limit page a list: with --count, on the list and the payload search alike.
    for paging in (("--before", "10"), ("--limit", "1"), ("--before", "10", "--payload", '{"a": 1}')):
        result = run_cli(dsn, "jobs", "--count", *paging)
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result
        assert "drop --before and --limit" in result.stderr and result.stdout == ""
