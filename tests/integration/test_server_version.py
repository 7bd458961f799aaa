"""The PostgreSQL the suite runs on is one jobtui supports, and the one CI meant to test:
.ci/run sets JOBTUI_TEST_PG_MAJOR for each of its runs (docs/integrations.md, "The package and
the PostgreSQL versions tested")."""

from __future__ import annotations

import os

import psycopg


def test_the_server_is_a_supported_version(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    row = conn.execute("SELECT current_setting('server_version_num')::int").fetchone()
    assert row is not None
    version = int(str(row[0]))
    assert version >= 140000, f"jobtui needs PostgreSQL 14 or newer, the suite runs on {version}"
    expected = os.environ.get("JOBTUI_TEST_PG_MAJOR")
    if expected:
        assert version // 10000 == int(expected), f"expected PostgreSQL {expected}, found {version}"
