"""Chaos run: a crash anywhere delays work, never loses or duplicates it.

    .venv/bin/python bench/chaos.py [--dsn DSN] [--jobs 5000] [--seconds 90] [--workers 4]
                                    [--concurrency 6] [--executor thread|process]
                                    [--restart-postgres] [--seed N]

The harness lives with the tests that run a short version of it (tests/chaos/harness.py,
where its docstring says what it does and checks); this is its command line.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make `tests` importable
    sys.path.insert(0, str(ROOT))

from tests.chaos.harness import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
