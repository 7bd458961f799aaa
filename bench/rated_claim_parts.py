"""Where a rated claim's extra server CPU goes: `claim_pick` for 10 jobs, each call its own
transaction, with no lever and with its type rated, in turns with migration 0022's
`claim_pick` and variants of it, on a scratch database.

    .venv/bin/python bench/rated_claim_parts.py [--dsn DSN] [--calls 1000] [--rounds 7]

A benchmark, not a test: it creates its own database (--dbname) on the server of --dsn,
migrates it with this tree's migrations, fills it with --jobs ready jobs of two types (one
rated far above what the loop reaches, so every call takes tokens), measures and drops it.
The server's CPU per call comes from /proc/PID/schedstat of the calling backend (the server
must be on this machine). The loops: `no lever` and `rated`, this tree's `claim_pick`;
`0022`, the function of migration 0022 (read from its file), whose bucket charge refilled
the bucket twice in its update; and variants of 0022's, each `claim_pick_<name>`, which say
what each part costs (the first two would not charge the bucket right: attribution only):

    no-update     0022's rated claim without the bucket's update
    no-expr       its update without its two bucket_tokens expressions
    fenced        its update skipping those expressions while the bucket's row is unchanged
                  since the claim's unlocked read (its raw tokens and refill time), in one
                  statement with a CASE
    fenced-first  a first update fenced by the row as read, without the expressions; 0022's
                  update only when it changed (what migration 0023 does)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent))
from claim_rates import backend_cpu
from core import create_database, drop_database

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
TOKENS = "jobtui.bucket_tokens(b.tokens, b.refilled_at, one_rate, one_from, one_until)"
WHERE = (
    "        WHERE b.kind = CASE WHEN cardinality(rated_queues) = 1 THEN 'queue' ELSE 'type' END\n"
    "          AND b.name = coalesce(rated_queues[1], rated_types[1])"
)
# The bucket's charge in the fast path of claim_pick (migration 0022), as PostgreSQL prints it.
CHARGE = (
    f"        SET tokens = {TOKENS} - cardinality(got),\n"
    "            refilled_at = greatest(b.refilled_at, now())\n"
    f"{WHERE}\n"
    f"          AND {TOKENS} >= cardinality(got);"
)


def replaced(body: str, old: str, new: str) -> str:
    if old not in body:
        raise SystemExit(f"claim_pick of this tree has no {old.strip()[:60]!r}: update the variants")
    return body.replace(old, new, 1)


def no_update(body: str) -> str:
    start = body.index("        UPDATE jobtui.rate_bucket AS b\n" + CHARGE.split("\n")[0])
    return body[:start] + "        RETURN got;\n" + body[body.index("        IF FOUND THEN", start) :]


def no_expr(body: str) -> str:
    return replaced(
        body,
        CHARGE,
        "        SET tokens = greatest(0.0, one_tokens - cardinality(got)),\n"
        f"            refilled_at = greatest(b.refilled_at, now())\n{WHERE};",
    )


def fenced(body: str) -> str:
    body = replaced(body, "    one_until timestamptz;\n", "    one_until timestamptz;\n    one_raw float8;\n"
                    "    one_refilled timestamptz;\n")  # fmt: skip
    body = replaced(body, "b.kind IS NULL AS no_bucket,", "b.kind IS NULL AS no_bucket, b.tokens AS raw_tokens,"
                    " b.refilled_at AS raw_refilled,")  # fmt: skip
    body = replaced(body, "                one_until := c.ramp_until;\n",
                    "                one_until := c.ramp_until;\n                one_raw := c.raw_tokens;\n"
                    "                one_refilled := c.raw_refilled;\n")  # fmt: skip
    unchanged = "b.tokens = one_raw AND b.refilled_at = one_refilled"
    return replaced(
        body,
        CHARGE,
        f"        SET tokens = CASE WHEN {unchanged} THEN one_tokens ELSE {TOKENS} END - cardinality(got),\n"
        f"            refilled_at = greatest(b.refilled_at, now())\n{WHERE}\n"
        f"          AND ({unchanged} OR {TOKENS} >= cardinality(got));",
    )


def fenced_first(body: str) -> str:
    """The charge without the expressions while the row is unchanged since the read; the
    charge as it is when another claim wrote the row in between."""
    body = fenced(body)
    unchanged = "b.tokens = one_raw AND b.refilled_at = one_refilled"
    fast = (
        "        SET tokens = one_tokens - cardinality(got), refilled_at = greatest(b.refilled_at, now())\n"
        f"{WHERE}\n          AND {unchanged};\n"
        "        IF FOUND THEN\n            RETURN got;\n        END IF;\n"
        "        UPDATE jobtui.rate_bucket AS b\n"
    )
    return replaced(
        body,
        f"        SET tokens = CASE WHEN {unchanged} THEN one_tokens ELSE {TOKENS} END - cardinality(got),\n"
        f"            refilled_at = greatest(b.refilled_at, now())\n{WHERE}\n"
        f"          AND ({unchanged} OR {TOKENS} >= cardinality(got));",
        fast + CHARGE,
    )


VARIANTS: dict[str, Callable[[str], str]] = {
    "0022": lambda body: body,
    "no-update": no_update,
    "no-expr": no_expr,
    "fenced": fenced,
    "fenced-first": fenced_first,
}


def prepare(conn: psycopg.Connection[Any], jobs: int) -> None:
    conn.execute(
        "INSERT INTO jobtui.job (type, payload) SELECT CASE WHEN g %% 2 = 0 THEN 'rated' ELSE 'plain' END, '{}'"
        " FROM generate_series(1, %s) AS g",
        (jobs,),
    )
    conn.execute("VACUUM ANALYZE jobtui.job")
    conn.execute(
        "INSERT INTO jobtui.queue_control (kind, name, rate_per_second, changed_by)"
        " VALUES ('type', 'rated', 1e6, 'bench')"
    )
    migration = (ROOT / "migrations" / "0022_claim_one_bucket.sql").read_text()
    body = migration[migration.index("CREATE OR REPLACE FUNCTION {schema}.claim_pick(") :]
    body = body[: body.index("\n$$;") + 4].replace("{schema}.", "jobtui.")
    for name, make in VARIANTS.items():
        variant = make(body).replace("jobtui.claim_pick(", f"jobtui.claim_pick_{name.replace('-', '_')}(", 1)
        conn.execute(sql.SQL(variant))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--dsn", default=os.environ.get("JOBTUI_BENCH_DSN", DEFAULT_DSN))
    p.add_argument("--dbname", default="bench_rated_parts")
    p.add_argument("--jobs", type=int, default=200_000)
    p.add_argument("--calls", type=int, default=1000, help="calls of each loop in a round")
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    dsn = create_database(args.dsn, args.dbname, "server")  # migrated with this tree's migrations
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            prepare(conn, args.jobs)
            pid = conn.info.backend_pid
            loops = {
                "no lever": "claim_pick(NULL, ARRAY['plain'], 10)",
                "rated": "claim_pick(NULL, ARRAY['rated'], 10)",
            }
            loops |= {name: f"claim_pick_{name.replace('-', '_')}(NULL, ARRAY['rated'], 10)" for name in VARIANTS}
            per_call: dict[str, list[float]] = {name: [] for name in loops}
            names = list(loops)
            for r in range(args.rounds):
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    statement = f"SELECT jobtui.{loops[name]}"
                    for _ in range(20):  # the plans made and cached
                        conn.execute(sql.SQL(statement))
                    before = backend_cpu(pid)
                    for _ in range(args.calls):
                        conn.execute(sql.SQL(statement))
                    per_call[name].append((backend_cpu(pid) - before) / args.calls * 1e6)
    finally:
        drop_database(args.dsn, args.dbname)
    base = statistics.median(per_call["no lever"])
    print(f"claim_pick of 10 jobs, each call its own transaction; server µs per call, medians of {args.rounds} rounds")
    print("| loop | µs per call | against no lever | rounds |")
    print("| --- | ---: | ---: | --- |")
    for name, values in per_call.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.1f} | {median / base - 1:+.1%} | {', '.join(f'{v:.0f}' for v in values)} |")


if __name__ == "__main__":
    main()
