"""Where sync handlers run, and what is written for an attempt: the pure parts of the
executors (their settings, a child's death told in words, what runs a job as the console
reads it, and `settled`, which decides an attempt's outcome from what the worker knows)."""

from __future__ import annotations

import signal
from datetime import UTC, datetime

import pytest

from jobtui import InvalidInput, Job, Jobs, Worker
from jobtui.core.maintenance import ARCHIVE_TYPE
from jobtui.kernel.domain import ClaimedJob, Runner
from jobtui.kernel.sizes import parse_size
from jobtui.worker.children import death_kind, death_reason
from jobtui.worker.config import check_children, executors, registry_spec
from jobtui.worker.executor import PROCESS, THREAD, InFlight, settled
from jobtui.worker.outcome import Outcome

DSN = "postgresql://nobody@127.0.0.1:1/none"


def flight(executor: str = THREAD) -> InFlight:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    claimed = ClaimedJob(7, "t", {}, 1, 3, 1, now, now, now)
    return InFlight(Job(claimed, "w", "jobtui"), claimed, 0.0, None, executor=executor)


# -- a child's death, in words ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "words", "kind"),
    [
        (-int(signal.SIGKILL), "killed by signal 9 (SIGKILL), as the kernel's OOM killer sends it", "SIGKILL"),
        (-int(signal.SIGSEGV), "died of a segmentation fault (signal 11, SIGSEGV)", "SIGSEGV"),
        (-int(signal.SIGABRT), "aborted (signal 6, SIGABRT)", "SIGABRT"),
        (-int(signal.SIGTERM), "killed by a signal (signal 15, SIGTERM)", "SIGTERM"),
        (3, "exited with status 3", "exit"),
        (0, "exited with status 0", "exit"),
        (None, "ended; its exit status is unknown", "exit"),
    ],
)
def test_a_childs_death_is_told_in_words(code: int | None, words: str, kind: str) -> None:
    assert death_reason(code) == f"ProcessDied: handler process {words}"
    assert death_kind(code) == kind


def test_an_unknown_signal_is_named_by_its_number() -> None:
    assert death_reason(-200) == "ProcessDied: handler process killed by a signal (signal 200, unknown signal)"
    assert death_kind(-200) == "signal 200"


# -- settings -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"), [("512M", 512 << 20), ("1.5G", 3 << 29), ("300MiB", 300 << 20), ("2048k", 2 << 20), ("77", 77)]
)
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "M", "-5M", "5X", "5 MB MB", "1e9"])
def test_bad_sizes_say_how_to_write_one(text: str) -> None:
    with pytest.raises(InvalidInput, match="write it like 512M"):
        parse_size(text)


def test_the_pool_settings_are_checked() -> None:
    check_children("process", 1, 1 << 20)
    for args, says in (
        (("fork", None, None), "--executor must be one of thread, process"),
        (("process", 0, None), "--max-jobs-per-child must be at least 1"),
        (("process", None, 1000), "--max-memory-per-child must be at least 1MiB"),
    ):
        with pytest.raises(InvalidInput, match=says):
            check_children(*args)


def test_a_handler_names_its_executor_and_an_async_one_cannot() -> None:
    jobs = Jobs()

    @jobs.handler("isolated", executor="process")
    def isolated(job: Job) -> None: ...

    @jobs.handler("plain")
    def plain(job: Job) -> None: ...

    @jobs.handler("loop")
    async def loop(job: Job) -> None: ...

    assert executors(jobs, THREAD) == {"isolated": PROCESS, "plain": THREAD, "loop": "async"}
    assert executors(jobs, PROCESS) == {"isolated": PROCESS, "plain": PROCESS, "loop": "async"}
    with pytest.raises(InvalidInput, match="executor must be one of thread, process"):
        jobs.handler("bad", executor="fork")
    with pytest.raises(InvalidInput, match="executor= is for sync handlers"):

        @jobs.handler("async.isolated", executor="process")
        async def no(job: Job) -> None: ...


def test_the_built_in_jobs_stay_in_the_workers_own_process() -> None:
    worker = Worker(Jobs(), DSN, executor=PROCESS, types=None)
    assert worker._executors[ARCHIVE_TYPE] == THREAD
    assert worker.app is None  # no handler of the app's runs in a process: no pool


def test_processes_need_a_registry_they_can_import_by_name() -> None:
    from tests.apps import stoppable_app

    assert registry_spec(stoppable_app.jobs) == "tests.apps.stoppable_app:jobs"
    local = Jobs()

    @local.handler("t")
    def t(job: Job) -> None: ...

    assert registry_spec(local) is None
    with pytest.raises(InvalidInput, match="define it at module level of an importable module, or pass app="):
        Worker(local, DSN, executor=PROCESS)
    assert Worker(local, DSN, executor=PROCESS, app="somewhere:jobs").app == "somewhere:jobs"
    assert Worker(stoppable_app.jobs, DSN, executor=PROCESS).app == "tests.apps.stoppable_app:jobs"


# -- what runs a job, as the console reads it (job.runner is untrusted data) ---------------------


@pytest.mark.parametrize(
    ("value", "runner"),
    [
        ({"token": 3, "executor": "process", "pid": 4242, "rss": 1 << 20}, Runner("process", 4242, 1 << 20)),
        ({"executor": "thread"}, Runner("thread")),
        ({"executor": "process", "pid": True, "rss": -1}, Runner("process")),  # a bool is no pid
        ({"executor": "process", "pid": "4242", "rss": 1.5}, Runner("process")),
        ({"executor": "process", "pid": 1 << 70}, Runner("process")),
        ({"executor": "\x1b[31mred"}, None),
        ({"executor": ["thread"]}, None),
        (["thread"], None),
        ("thread", None),
        (None, None),
    ],
)
def test_a_runner_is_read_as_untrusted_data(value: object, runner: Runner | None) -> None:
    assert Runner.decoded(value) == runner


# -- settled: what is written once the handler stopped ----------------------------------------


def test_an_attempt_whose_lease_is_surely_lost_writes_nothing() -> None:
    f = flight()
    f.gone = True
    assert settled(f, Outcome.COMPLETE, "") is None


def test_a_thread_given_up_that_returned_without_seeing_it_finishes() -> None:
    f = flight()
    f.given_up = "its lease was not extended in time"
    f.job.mark_lost()
    assert f.job.marked_lost and not f.job.loss_seen  # the worker's own reads do not count
    assert settled(f, Outcome.COMPLETE, "") == (Outcome.COMPLETE, "")
    assert settled(f, Outcome.FAIL, "ValueError: x") == (Outcome.FAIL, "ValueError: x")


@pytest.mark.parametrize("saw", ["lost", "heartbeat"])
def test_a_handler_that_saw_its_loss_is_released_uncounted(saw: str) -> None:
    f = flight()
    f.given_up = "its lease was not extended in time"
    f.job.mark_lost()
    assert (f.job.lost if saw == "lost" else not f.job.heartbeat()) and f.job.loss_seen
    assert settled(f, Outcome.COMPLETE, "") == (
        Outcome.ABANDONED,
        "attempt given up: its lease was not extended in time",
    )


def test_reading_cancelled_before_any_cancel_sees_nothing() -> None:
    f = flight()
    assert not f.job.cancelled and not f.job.lost and not f.job.loss_seen
    f.job.mark_cancelled()
    assert f.job.cancelled and f.job.loss_seen


def test_a_job_never_ends_done_after_once_refused_an_effect() -> None:
    f = flight()
    f.job.mark_lost()
    with pytest.raises(Exception, match="lost its lease"):
        f.job.once(None, "k")  # type: ignore[arg-type]  # refused before it touches the connection
    assert settled(f, Outcome.COMPLETE, "") == (
        Outcome.ABANDONED,
        "attempt given up: its lease was lost (an effect was refused)",
    )


def test_a_timeout_counts_whatever_the_handler_saw() -> None:
    f = flight()
    f.timed_out = True
    f.job.mark_lost()
    assert f.job.lost
    assert settled(f, Outcome.TIMEOUT, "TimeoutError: x") == (Outcome.TIMEOUT, "TimeoutError: x")
