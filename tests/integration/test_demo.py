"""The headless demo: every failure mode of the design shows up in its own schema."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]


def test_headless_demo_shows_every_failure_mode(dsn: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("JOBTUI_DSN", "DATABASE_URL")}
    proc = subprocess.run(
        [sys.executable, "-m", "jobtui.cli", "--dsn", dsn, "demo", "--no-tui", "--seconds", "22"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "Jobs by type" in proc.stdout and "Dead and failed" in proc.stdout

    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT status, count(*) FROM jobtui_demo.job GROUP BY status").fetchall()
        counts: dict[str, int] = dict(rows)
        assert counts.get("done", 0) > 50  # quick jobs ran
        dead_types = {r[0] for r in conn.execute("SELECT DISTINCT type FROM jobtui_demo.job WHERE status = 'dead'")}
        assert "invoice.render" in dead_types  # the poison type ends dead
        failed = conn.execute("SELECT count(*) FROM jobtui_demo.job WHERE status = 'failed'").fetchone()
        assert failed is not None and failed[0] > 0  # Permanent errors fail at once
        retried_done = conn.execute(
            "SELECT count(*) FROM jobtui_demo.job WHERE status = 'done' AND type = 'webhook.deliver' AND attempts > 1"
        ).fetchone()
        assert retried_done is not None and retried_done[0] > 0  # flaky jobs succeed after retries
        expiries = conn.execute(
            "SELECT count(*) FROM jobtui_demo.lease_expiry WHERE job_type = 'image.resize'"
        ).fetchone()
        assert expiries is not None and expiries[0] > 0  # the crashing type's leases expired
        schedules = {
            name: (paused, missed)
            for name, paused, missed in conn.execute("SELECT name, paused, missed_count FROM jobtui_demo.schedule")
        }
        assert schedules["demo.paused"][0] is True
        assert schedules["demo.catch-up"][1] >= 10  # the simulated outage left missed slots
        fired = conn.execute("SELECT count(*) FROM jobtui_demo.job WHERE idempotency_key LIKE 'schedule:%'").fetchone()
        assert fired is not None and fired[0] >= 3  # schedules fired
        # Nothing of the demo leaked outside its schema.
        other = conn.execute("SELECT count(*) FROM jobtui.job").fetchone()
        assert other is not None and other[0] == 0
