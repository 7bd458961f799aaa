"""One matcher for `--error`: `jobtui dead --error E` lists the groups of exactly the jobs
`jobtui requeue --error E` moves (its dry run counts and names them), for any pattern.

The commands run through the CLI's own entry point in this process (no interpreter start-up
per pattern) against dead and failed jobs whose errors carry tracebacks, numbers and ids.
What matches is the error's first line or its fingerprint, never the traceback.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobtui import Client, InvalidInput, JobFilter
from jobtui.cli.main import main
from jobtui.kernel.checks import MAX_PATTERN_CHARS
from jobtui.kernel.jobfilter import parse_filter

Conn = psycopg.Connection[Any]

TRACEBACK = 'Traceback (most recent call last):\n  File "/srv/app1/handlers.py", line 12, in send\n    raise {error}\n'
# (type, status, error) of each seeded job, first lines distinct enough to tell apart.
JOBS = [
    ("email", "dead", "KeyError: 'user 22'\n" + TRACEBACK.format(error="KeyError('user 22')")),
    ("email", "dead", "KeyError: 'user 17'\n" + TRACEBACK.format(error="KeyError('user 17')")),
    ("email", "failed", "Permanent: invalid address 12"),
    ("report", "dead", "TimeoutError: upstream took 30s\n" + TRACEBACK.format(error="TimeoutError()")),
    ("report", "dead", "TimeoutError: upstream took 31s\n" + TRACEBACK.format(error="TimeoutError()")),
    ("hook", "dead", "ConnectionError: POST https://hooks.example.com/4: connection reset by peer"),
    ("hook", "dead", "ValueError: no order 3f2a9c1e-4b5d-4e6f-8a7b-9c0d1e2f3a4b\n" + TRACEBACK.format(error="X")),
    ("crash", "dead", "lease expired: worker w1 stopped heartbeating during attempt 3 of 3"),
    ("crash", "dead", None),  # no error recorded
]


def cli(dsn: str, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["--dsn", dsn, "--actor", "matcher-test", *args])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def seeded(server_dsn: str, template_db: str) -> Iterator[tuple[str, list[int]]]:
    """A database of this module's own with the jobs of JOBS (and a ready one), their ids."""
    from tests.conftest import _create_clone, _drop

    name, dsn = _create_clone(server_dsn, template_db)
    ids = []
    with Client(dsn) as q, psycopg.connect(dsn, autocommit=True) as conn:
        q.enqueue("email")  # ready: never matched
        for job_type, status, error in JOBS:
            job_id = q.enqueue(job_type)
            conn.execute(
                "UPDATE jobtui.job SET status = %s, attempts = 3, last_error = %s, finished_at = now() WHERE id = %s",
                (status, error, job_id),
            )
            ids.append(job_id)
    yield dsn, ids
    _drop(server_dsn, name)


def dead_ids(dsn: str, *args: str) -> tuple[int, list[int]]:
    """(jobs counted, ids listed) by `jobtui dead ARGS --json`."""
    code, out, err = cli(dsn, "dead", *args, "--json")
    assert code == 0 and err == "", err
    groups = json.loads(out)
    assert all(g["jobs"] == len(g["job_ids"]) for g in groups)
    return sum(g["jobs"] for g in groups), sorted(i for g in groups for i in g["job_ids"])


def dry_run_ids(dsn: str, *args: str) -> tuple[int, list[int]]:
    """(jobs counted, ids named) by `jobtui requeue ARGS --dry-run`."""
    code, out, err = cli(dsn, "requeue", *args, "--dry-run")
    assert code == 0 and err == "", err
    match = re.fullmatch(r"would requeue (\d+) job\(s\)(?:: ([\d, ]+))? \(dry run, nothing changed\)\n", out)
    assert match, out
    return int(match.group(1)), sorted(int(i) for i in (match.group(2) or "").split(", ") if i)


# (pattern, --type or None, indexes in JOBS of the jobs it names)
PATTERNS = [
    ("user 22", None, [0]),  # the first line, numbers as they are
    ("user <n>", None, [0, 1]),  # the fingerprint, as `jobtui dead` shows it
    ("KEYERROR", None, [0, 1]),  # case-insensitive
    (r"^KeyError: 'user \d+'$", None, [0, 1]),  # anchored to the first line
    ("app1", None, []),  # only in the tracebacks: never matched
    ("Traceback", None, []),
    ("handlers\\.py", None, []),
    (r"\mtimeouterror", None, [3, 4]),  # PostgreSQL's syntax: \m starts a word
    ("took 3[01]s", None, [3, 4]),
    ("took <n>s", "report", [3, 4]),
    ("timeout", "email", []),
    ("hooks\\.example\\.com/4", None, [5]),
    ("<uuid>", None, [6]),
    ("3f2a9c1e", None, [6]),
    ("lease expired.*attempt 3 of 3", None, [7]),
    ("invalid address", None, [2]),  # failed jobs too
    (".", None, [0, 1, 2, 3, 4, 5, 6, 7]),  # every job with an error
    ("user 22|reset by peer", None, [0, 5]),
]


@pytest.mark.parametrize(("pattern", "job_type", "expected"), PATTERNS)
def test_dead_and_requeue_dry_run_name_the_same_jobs(
    seeded: tuple[str, list[int]], pattern: str, job_type: str | None, expected: list[int]
) -> None:
    dsn, ids = seeded
    args = ["--error", pattern, *(["--type", job_type] if job_type else [])]
    listed, counted = dead_ids(dsn, *args), dry_run_ids(dsn, *args)
    assert listed == counted == (len(expected), sorted(ids[i] for i in expected))
    text = cli(dsn, "dead", *args)[1]
    assert (f"{len(expected)} job(s) in " in text) if expected else text == "no dead or failed jobs match\n"


def test_the_requeue_moves_the_rows_the_dry_run_named(seeded: tuple[str, list[int]]) -> None:
    dsn, ids = seeded
    with psycopg.connect(dsn, autocommit=True) as conn:  # put back afterwards, for the other tests
        before = conn.execute("SELECT id, status, attempts FROM jobtui.job ORDER BY id").fetchall()
    _, named = dry_run_ids(dsn, "--error", "user <n>|upstream")
    code, out, _ = cli(dsn, "requeue", "--error", "user <n>|upstream")
    assert (code, out) == (0, f"requeued {len(named)} job(s)\n")
    with psycopg.connect(dsn, autocommit=True) as conn:
        ready = {r[0] for r in conn.execute("SELECT id FROM jobtui.job WHERE status = 'ready'")}
        assert set(named) == {ids[0], ids[1], ids[3], ids[4]} and set(named) <= ready
        assert dead_ids(dsn, "--error", "user <n>|upstream") == (0, [])
        audit = conn.execute("SELECT action, job_ids, rows FROM jobtui.audit ORDER BY id DESC LIMIT 1").fetchone()
        assert audit == ("requeue", named, len(named))
        for job_id, status, attempts in before:
            conn.execute("UPDATE jobtui.job SET status = %s, attempts = %s WHERE id = %s", (status, attempts, job_id))


# Pieces of the seeded errors and of regular expressions: patterns built from them match some
# jobs, none, or all, through the first line, the fingerprint or only the traceback.
PIECES = st.sampled_from(
    ["user", "22", "17", "<n>", "KeyError", "key", "error", "app1", "Traceback", "took", "3", "s", "upstream",
     "timeout", "POST", "hooks", "example", "<uuid>", "3f2a", "lease", "w1", "of", "Permanent", "'", ":", " ",
     ".", ".*", "^", "$", "|", "\\d+", "[0-9]", "\\m", "(", ")", "?", "+", "[a-z]+", "\\s"]
)  # fmt: skip


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(PIECES, min_size=1, max_size=5), job_type=st.sampled_from([None, "email", "report", "crash"]))
def test_any_pattern_names_the_same_jobs_in_dead_and_the_dry_run(
    seeded: tuple[str, list[int]], pieces: list[str], job_type: str | None
) -> None:
    dsn, _ = seeded
    pattern = "".join(pieces)
    args = ["--error", pattern, *(["--type", job_type] if job_type else [])]
    code, _, err = cli(dsn, "dead", *args)
    if code != 0:  # not a regular expression PostgreSQL accepts: both say so, the same way
        assert code == 2 and err.startswith(f"jobtui: error: bad --error pattern {pattern!r}"), err
        assert cli(dsn, "requeue", *args, "--dry-run")[2] == err
        return
    assert dead_ids(dsn, *args) == dry_run_ids(dsn, *args)


@pytest.mark.parametrize(
    "command",
    [
        ["dead", "--error"],
        ["requeue", "--dry-run", "--error"],
        ["requeue", "--error"],
        ["bulk", "requeue", "--dry-run", "--error"],
    ],
)
def test_a_pattern_longer_than_postgresql_compiles_quickly_is_refused_in_one_line(
    seeded: tuple[str, list[int]], command: list[str]
) -> None:
    """PostgreSQL compiles a case-insensitive pattern in time that grows with the square of
    its length (about a minute at 100,000 characters): a longer one than the bound is bad
    input, refused before it reaches the server; one at the bound runs."""
    dsn, _ = seeded
    before = dead_ids(dsn)
    code, out, err = cli(dsn, *command, "x" * (MAX_PATTERN_CHARS + 1))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "(2,001 characters): give at most 2,000 characters" in err, err
    assert dead_ids(dsn) == before  # nothing moved
    assert dead_ids(dsn, "--error", "x" * MAX_PATTERN_CHARS) == (0, [])


def test_the_bound_holds_for_the_clients_filters_and_the_console_words(seeded: tuple[str, list[int]]) -> None:
    dsn, _ = seeded
    long = "(" + "x" * MAX_PATTERN_CHARS
    with pytest.raises(InvalidInput, match="give at most 2,000 characters"):
        JobFilter(error=long)
    with pytest.raises(InvalidInput, match="give at most 2,000 characters"):
        parse_filter(f"error:{long}")  # the console's and the web console's filter words
    with Client(dsn) as q, pytest.raises(InvalidInput, match="give at most 2,000 characters"):
        q.requeueable(error=long)
