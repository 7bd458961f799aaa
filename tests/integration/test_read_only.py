"""`jobtui --read-only COMMAND`: every command that changes the database refuses, in one line
with exit code 2, and leaves every row and every schema as it was; the commands that only
read (and the dry runs of those that change) work as without it."""

from __future__ import annotations

import argparse
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from jobtui.cli.args import CHANGES, READS
from jobtui.cli.main import build_parser
from tests.cli import clean_env
from tests.integration.test_operator_cli import ROOT, ok, seed, user_error

Conn = psycopg.Connection[Any]
APP = "tests.apps.metrics_app:jobs"


def jobtui(dsn: str, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """`jobtui --read-only ARGS` as a process of its own."""
    result = subprocess.run(
        [sys.executable, "-m", "jobtui.cli", "--actor", "tester", "--read-only", *args],
        env=clean_env(dsn), cwd=ROOT, input=stdin, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert "Traceback" not in result.stderr, result.stderr
    return result


def everything(conn: Conn) -> dict[str, list[str]]:
    """Every row of every table of the schema, the schemas, and the schema's indexes."""
    tables = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'jobtui'")]
    found = {
        table: sorted(
            str(r[0]) for r in conn.execute(sql.SQL("SELECT t::text FROM jobtui.{} t").format(sql.Identifier(table)))
        )
        for table in tables
    }
    found["(schemas)"] = sorted(r[0] for r in conn.execute("SELECT nspname FROM pg_namespace"))
    found["(indexes)"] = sorted(
        r[0] for r in conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = 'jobtui'")
    )
    return found


def commands(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """The words of every command the parser runs: its leaves, the console, and a command
    whose subcommands are optional (`jobtui workers` lists, `jobtui workers quiet` orders)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return {words}
    found = {words} if not words or not all(a.required for a in subs) else set()
    for action in subs:
        for name, sub in action.choices.items():
            found |= commands(sub, (*words, name))
    return found


def test_every_command_is_a_change_or_a_read() -> None:
    """A new command must be put in one table or the other (jobtui/cli/args.py)."""
    assert not set(CHANGES) & READS
    assert commands(build_parser()) == set(CHANGES) | READS


def test_every_change_command_refuses_and_changes_nothing(dsn: str, conn: Conn, tmp_path: Path) -> None:
    seeded = seed(dsn, conn)
    for setup in (
        ["schedule", "add", "nightly", "--cron", "0 2 * * *", "--type", "email"],
        ["queue", "pause", "paused"],
        ["type", "pause", "report"],
    ):
        ok(subprocess.run([sys.executable, "-m", "jobtui.cli", *setup], env=clean_env(dsn), cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False))  # fmt: skip
    before = everything(conn)
    assert before["audit"] and before["schedule"] and before["queue_control"], before
    dead, ready, running = str(seeded.k17), str(seeded.ready), str(seeded.running)
    runs = [
        ["migrate"],
        ["enqueue", "email", "--payload", '{"to": "x"}'],
        ["worker", "--app", APP, "--no-scheduler"],
        ["scheduler"],
        ["schedule", "add", "hourly", "--cron", "0 * * * *", "--type", "email"],
        ["schedule", "pause", "nightly"],
        ["schedule", "resume", "nightly"],
        ["schedule", "run-now", "nightly"],
        ["schedule", "remove", "nightly"],
        ["requeue", dead],
        ["requeue", "--all"],
        ["kill-lease", running],
        ["cancel", ready],
        ["queue", "pause", "default"],
        ["queue", "resume", "paused", "--ramp", "60s"],
        ["queue", "rate", "api", "5/s"],
        ["queue", "limit", "default", "2"],
        ["type", "pause", "email"],
        ["type", "resume", "report"],
        ["type", "rate", "email", "1/s"],
        ["workers", "quiet", "w1"],
        ["workers", "resume", "--host", "h"],
        ["workers", "stop", "--version", "0.3.0"],
        ["index", "payload"],
        ["index", "payload", "--drop"],
        ["bulk", "requeue", "--all", "--yes"],
        ["bulk", "discard", "--type", "email", "--yes"],
        ["bulk", "cancel", "--all", "--yes"],
        ["uninstall", "--yes"],
        ["bench", "--jobs", "10"],
        ["demo", "--no-tui", "--seconds", "1"],
    ]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda args: jobtui(dsn, *args), runs))
    refused = set()
    for args, result in zip(runs, results, strict=True):
        said = user_error(result)
        words = next(tuple(args[:n]) for n in (2, 1) if tuple(args[:n]) in CHANGES)
        assert said.startswith(f"jobtui: error: `jobtui {' '.join(words)}` changes the database, which --read-only"
                               " forbids: run it without --read-only"), said  # fmt: skip
        assert result.stdout == "", result.stdout
        refused.add(words)
    assert refused == set(CHANGES)  # every change command is tried
    assert "or with --dry-run to change nothing" in user_error(results[runs.index(["requeue", "--all"])])
    assert "or with --check or --dry-run" in user_error(results[0])
    assert everything(conn) == before


def test_reads_and_dry_runs_still_work(dsn: str, conn: Conn, tmp_path: Path) -> None:
    seeded = seed(dsn, conn)
    before = everything(conn)
    users = str(tmp_path / "users")
    runs: list[tuple[list[str], str]] = [
        (["stats"], "dead 3"),
        (["stats", "--json"], '"dead"'),
        (["dead"], "KeyError"),
        (["jobs", "--status", "dead"], "email"),
        (["jobs", "--count"], "dead"),
        (["job", str(seeded.k17)], "dead"),
        (["audit"], ""),
        (["queue", "list"], "default"),
        (["schedule", "list"], "name"),
        (["workers", "--json"], '"processes"'),
        (["health"], "ready: "),
        (["migrate", "--check"], "no migration pending"),
        (["migrate", "--dry-run"], "COMMIT;"),
        (["requeue", "--all", "--dry-run"], "4"),
        (["bulk", "requeue", "--all", "--dry-run"], "would requeue 4 "),
        (["bulk", "cancel", "--all", "--dry-run"], "would cancel 2 "),
        (["user", "list", "--users", users], ""),
    ]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda run: jobtui(dsn, *run[0]), runs))
    for (args, says), result in zip(runs, results, strict=True):
        assert says in ok(result), (args, result.stdout)
    # The users file of `jobtui serve` is not the database: user management stays open.
    added = jobtui(dsn, "user", "add", "erin", "--users", users, stdin="erin-password-12\n")
    assert "added as viewer" in ok(added)
    assert "erin:viewer:$argon2id$" in Path(users).read_text()
    assert everything(conn) == before
