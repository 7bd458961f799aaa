"""How fast a worker's /readyz follows the database, and that /healthz does not.

    .venv/bin/python bench/probes.py [--dsn DSN] [--rounds 5] [--outage 4]

A benchmark, not a test. It makes a database of its own (jobtui_bench_probes) on the server
of --dsn and migrates it, starts one `jobtui worker --metrics-port` whose connections go
through the tests' TCP proxy (tests/proxy.py), and each round takes the database away for
--outage seconds twice: the proxy cut (connections reset, new ones refused), then frozen
(no byte moves). It polls /readyz and /healthz every 20 ms and prints, per way and as the
median and the largest of the rounds, the seconds from the outage's start to the first 503
of /readyz and from its end to the first 200; and whether /healthz ever answered anything
but 200. Exit code 1 when it did, or when a transition took more than 3 s. The database is
dropped at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make `tests` importable
    sys.path.insert(0, str(ROOT))

from jobtui import migrate  # noqa: E402
from tests.probes import free_port, get  # noqa: E402
from tests.proxy import Proxy  # noqa: E402

DEFAULT_DSN = os.environ.get("JOBTUI_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
BENCH_DB = "jobtui_bench_probes"


def with_dbname(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo(**params)  # type: ignore[arg-type]


def until(condition: Callable[[], bool], lived: list[tuple[int, str]], port: int, timeout: float = 30) -> float:
    """Seconds until `condition` holds, polling /healthz into `lived` meanwhile."""
    started = time.monotonic()
    while not condition():
        lived.append(get(port, "/healthz", timeout=5))
        if time.monotonic() - started > timeout:
            raise SystemExit(f"nothing changed within {timeout}s")
        time.sleep(0.02)
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--outage", type=float, default=4.0, help="seconds each outage lasts")
    args = parser.parse_args()
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(BENCH_DB)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(BENCH_DB)))
    dsn = with_dbname(args.dsn, BENCH_DB)
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate.migrate(conn)
    figures: dict[str, list[float]] = {"cut": [], "restore": [], "freeze": [], "thaw": []}
    lived: list[tuple[int, str]] = []
    log = Path(tempfile.mkdtemp(prefix="jobtui-bench-probes-")) / "worker.log"
    try:
        with Proxy(dsn) as proxy, log.open("wb") as out:
            port = free_port()
            env = {**os.environ, "JOBTUI_DSN": proxy.dsn(dsn)}
            command = [sys.executable, "-m", "jobtui.cli", "worker", "--app", "tests.apps.metrics_app:jobs",
                       "--no-scheduler", "--metrics-port", str(port), "--metrics-addr", "127.0.0.1"]  # fmt: skip
            worker = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
            try:
                until(lambda: get(port, "/readyz")[0] == 200, [], port)  # the start, before it listens
                for _ in range(args.rounds):
                    for down, up in ((proxy.cut, proxy.restore), (proxy.freeze, proxy.thaw)):
                        down()
                        figures[down.__name__].append(until(lambda: get(port, "/readyz")[0] == 503, lived, port))
                        time.sleep(max(0.0, args.outage - figures[down.__name__][-1]))
                        up()
                        figures[up.__name__].append(until(lambda: get(port, "/readyz")[0] == 200, lived, port))
            finally:
                worker.terminate()
                worker.wait(60)
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(BENCH_DB)))
    print(f"{'transition':<28}{'median s':>10}{'max s':>8}   ({args.rounds} rounds, outages of {args.outage:g}s)")
    labels = {
        "cut": "not ready after a cut",
        "restore": "ready after the restore",
        "freeze": "not ready after a freeze",
        "thaw": "ready after the thaw",
    }
    for key, label in labels.items():
        print(f"{label:<28}{statistics.median(figures[key]):>10.2f}{max(figures[key]):>8.2f}")
    others = sorted({answer for answer in lived if answer[0] != 200})
    print(f"/healthz answered 200 to all {len(lived)} polls" if not others else f"/healthz also answered {others}")
    slow = max(max(v) for v in figures.values()) > 3.0
    return 1 if others or slow else 0


if __name__ == "__main__":
    sys.exit(main())
