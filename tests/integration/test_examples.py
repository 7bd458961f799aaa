"""The examples docs/integrations.md shows, run as scripts against a fresh migrated database:
each must exit 0 and print what the docs say it prints."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

EXPECTED = {
    "middleware.py": "built for acme\nreported ValueError from job 2\n",
    "query_api.py": "ready in the mail queue: 5\n  email.send: 5\n  sms.send: 1\n"
    "page: [5, 4] created True\npage: [3, 2] created True\npage: [1] created True\n",
    "typed_payloads.py": "refused: payload for 'email.welcome' does not fit Welcome: user_id: Input should be a valid "
    "integer, unable to parse string as an integer (and 1 more)\nwelcome, ada (user 1)\n",
    "otel_tracing.py": "['POST /signup', 'enqueue email.send', 'run email.send'] complete\n",
}


@pytest.mark.parametrize("example", sorted(EXPECTED))
def test_example_runs_as_documented(dsn: str, example: str) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / example)],
        env={**os.environ, "JOBTUI_DSN": dsn}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == EXPECTED[example]
