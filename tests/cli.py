"""jobtui's command line run from a test: in this process (the same entry point, without an
interpreter's start-up time) or as a process, as people run it."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from jobtui.cli.main import main
from tests.workers import ROOT


@dataclass(frozen=True)
class Ran:
    code: int
    out: str
    err: str


def jobtui(dsn: str, *args: str) -> Ran:
    """`jobtui --dsn DSN ARGS` through the CLI's main, in this process (without the 128 KiB
    limit of one exec argument, too)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["--dsn", dsn, *args])
        except SystemExit as exc:  # argparse
            code = exc.code if isinstance(exc.code, int) else 1
    return Ran(code, out.getvalue(), err.getvalue())


def clean_env(dsn: str | None = None) -> dict[str, str]:
    """This process's environment without a database of its own: the DSN given, or none."""
    env = {k: v for k, v in os.environ.items() if k not in ("JOBTUI_DSN", "DATABASE_URL")}
    if dsn is not None:
        env["JOBTUI_DSN"] = dsn
        env["PYTHONUNBUFFERED"] = "1"
    return env


def run_cli(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`python -m jobtui.cli ARGS` as a process, to its end; its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "jobtui.cli", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def popen_cli(*args: str, env: dict[str, str], **popen: Any) -> subprocess.Popen[str]:
    """`python -m jobtui.cli ARGS` started as a process that runs on (a server, a worker)."""
    return subprocess.Popen(
        [sys.executable, "-m", "jobtui.cli", *args],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )
