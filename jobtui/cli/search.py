"""`jobtui jobs --payload` (the jobs search, with its progress on stderr and Ctrl-C to stop)
and `jobtui index payload` (the payload's optional GIN index)."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import timedelta
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from jobtui.cli import ops
from jobtui.cli.args import job_id, positive_int, with_client, with_dsn
from jobtui.cli.output import print_json
from jobtui.clients.client import Client
from jobtui.core import payloadindex
from jobtui.core.audit import record_audit
from jobtui.kernel.db import connect
from jobtui.kernel.durations import parse_duration
from jobtui.kernel.errors import InvalidInput
from jobtui.kernel.jobfilter import JobFilter, payload_of
from jobtui.kernel.safetext import line
from jobtui.kernel.server import now_call
from jobtui.reads.jobquery import JobCount, SearchCancelled, search, search_count

PAGE = 50  # jobs per page of `jobtui jobs` without --limit


@contextmanager
def progress_bar(what: str, *, total: float = 1.0) -> Iterator[Any]:
    """A rich progress bar on stderr (nothing when stderr is not a terminal); yields
    `update(done, said)`."""
    err = Console(stderr=True, markup=False, highlight=False, emoji=False)
    if not err.is_terminal:
        yield lambda done, said="": None
        return
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[said]}"),
        console=err,
        transient=True,
    )
    with bar:
        task = bar.add_task(what, total=total, said="")
        yield lambda done, said="": bar.update(task, completed=done, said=line(said))


def search_filter(args: argparse.Namespace) -> JobFilter:
    """The `jobs` options as the search's filter (`--error` is matched as `jobs --error` does)."""
    since = None if args.since is None else parse_duration(args.since)
    return JobFilter(
        statuses=tuple(args.status.split(",")) if args.status else (),
        types=(args.type,) if args.type else (),
        queue=args.queue,
        payload=payload_of(args.payload, args.payload_path or ()),
        newer_than=since,
    )


def cmd_jobs(args: argparse.Namespace, client: Client) -> int:
    """`jobtui jobs`: the query API's page, or with --payload/--payload-path the search."""
    if args.count and (args.before is not None or args.limit is not None):
        # --before and --limit page a list; a count that left them out would look like the page's.
        raise InvalidInput("--count counts every matching job, not a page: drop --before and --limit")
    args.limit = PAGE if args.limit is None else args.limit
    if args.payload is None and not args.payload_path:
        return _jobs_page(args, client)
    filt = search_filter(args)
    timeout = parse_duration(args.timeout)
    with connect(client.dsn, autocommit=True, pooler=client.pooler) as conn:
        try:
            with progress_bar("counting" if args.count else "searching") as update:
                if args.count:
                    counts = search_count(conn, filt, error=args.error, schema=client.schema, timeout=timeout,
                                          progress=lambda done, n: update(done, f"{n:,} found"))  # fmt: skip
                else:
                    found = search(conn, filt, error=args.error, limit=args.limit, before=args.before,
                                   schema=client.schema, timeout=timeout,
                                   progress=lambda done, n: update(done, f"{n:,} found"))  # fmt: skip
        except KeyboardInterrupt:
            print("jobtui: the search was cancelled (Ctrl-C); nothing was changed", file=sys.stderr)
            return 130
        except SearchCancelled as exc:
            raise InvalidInput(str(exc)) from None
    if args.count:
        return _print_counts(counts, as_json=args.json)
    if args.json:
        jobs = [{**asdict(j), "status": j.status.value} for j in found.jobs]
        print_json({"jobs": jobs, "more": found.more, "matched": found.matched, "complete": found.complete})
        return 0
    title = f"Jobs whose payload contains {json.dumps(filt.payload, ensure_ascii=False)} (newest first)"
    table = Table("id", "type", "queue", "status", "attempts", "created", "worker", "last error", title=title)
    for j in found.jobs:
        attempts = f"{j.attempts}/{j.max_attempts if j.max_attempts is not None else '-'}"
        created = j.created_at.isoformat(timespec="seconds")
        table.add_row(
            str(j.id), j.type, j.queue, j.status.value, attempts, created, j.worker or "-", j.last_error or "-"
        )
    ops.wide_console().print(table)
    how = "" if found.indexed else " (read without an index: `jobtui index payload` makes it fast)"
    print(f"{found.said()} matching job(s){how}")
    if found.more:
        print(f"older jobs: add --before {found.jobs[-1].id}; --count counts them all")
    return 0


def cmd_index(args: argparse.Namespace, dsn: str) -> int:
    """`jobtui index payload [--drop]`: build (or drop) the payload's GIN index without
    blocking enqueues or claims. It needs the role that owns the job table."""
    schema = args.schema
    with connect(dsn, autocommit=True, pooler=args.pooler) as conn:
        state = payloadindex.state(conn, schema)
        if args.drop:
            payloadindex.drop(conn, schema)
            # Not audit.operate: DROP/CREATE INDEX CONCURRENTLY cannot run in a transaction, so
            # the audit row follows the change once it is done.
            with conn.transaction():
                record_audit(conn, args.actor, "index-drop", "index job_payload_idx", int(bool(state)), schema=schema)
            print("the payload index is dropped" if state else "there was no payload index")
            return 0
        if state and state[0]["valid"]:
            print(f"the payload index exists ({state[0]['bytes'] / 1e6:,.0f} MB); nothing to do")
            return 0
        if state:  # left invalid by a build that was interrupted: it only slows writes down
            print("an interrupted build left the payload index invalid: dropping it first", file=sys.stderr)
            payloadindex.drop(conn, schema)
        print(
            "building job_payload_idx (GIN, jsonb_path_ops) without blocking enqueues or claims; every enqueue"
            " and every change of a job's row then updates it too",
            file=sys.stderr,
        )
        done = threading.Event()
        watcher = threading.Thread(target=_watch_build, args=(dsn, args.pooler, schema, done), daemon=True)
        watcher.start()
        started = time.monotonic()
        try:
            payloadindex.create(conn, schema)
        finally:
            done.set()
            watcher.join(timeout=2)
        with conn.transaction():
            record_audit(conn, args.actor, "index-create", "index job_payload_idx", 1, schema=schema)
        state = payloadindex.state(conn, schema)
    size = state[0]["bytes"] / 1e6 if state else 0.0
    print(f"the payload index is built ({size:,.0f} MB, {time.monotonic() - started:.0f}s)")
    return 0


def _watch_build(dsn: str, pooler: str, schema: str, done: threading.Event) -> None:
    """The build's progress, from pg_stat_progress_create_index on a connection of its own."""
    with connect(dsn, autocommit=True, pooler=pooler) as conn, progress_bar("building the payload index") as update:
        while not done.wait(0.5):
            rows = payloadindex.progress(conn, schema)
            if rows:
                r = rows[0]
                total = r["blocks_total"] or r["tuples_total"] or 0
                part = (r["blocks_done"] or r["tuples_done"] or 0) / total if total else 0.0
                update(part, str(r["phase"]))


def add_jobs_parser(sub: Any) -> None:
    p = sub.add_parser("jobs", help="list jobs, newest first, or count them (--count)")
    p.add_argument("--status", help="comma-separated statuses: ready, running, done, failed, dead")
    p.add_argument("--type", help="only this job type")
    p.add_argument("--queue", help="only jobs of this queue")
    p.add_argument("--since", help="created this long ago or less, e.g. 1h")
    p.add_argument("--error", help="regular expression the last error matches")
    p.add_argument("--limit", type=positive_int, help=f"jobs per page (default {PAGE}, at most 1000)")
    p.add_argument("--before", type=job_id, help="the page older than this job id")
    p.add_argument("--count", action="store_true", help="how many jobs match, by status and type")
    p.add_argument("--json", action="store_true")
    _add_search_options(p)
    p.set_defaults(func=with_client(cmd_jobs))


def _add_search_options(p: argparse.ArgumentParser) -> None:
    """The `jobs` options of the search."""
    p.add_argument(
        "--payload",
        metavar="JSON",
        help='only jobs whose payload contains this JSON object (jsonb @>), e.g. \'{"account": "acme"}\'',
    )
    p.add_argument(
        "--payload-path",
        action="append",
        metavar="KEY=VALUE",
        help="only jobs whose payload has KEY (a.b for nested keys) equal to VALUE (JSON, else text); repeatable",
    )
    p.add_argument(
        "--timeout",
        default="30s",
        help="with --payload: the longest one statement of the search may take (default 30s)",
    )


def add_index_parser(sub: Any) -> None:
    p = sub.add_parser("index", help="optional indexes: `index payload` makes payload searches fast")
    p.add_argument("which", choices=["payload"], help="payload: a GIN index on the payload (jsonb_path_ops)")
    p.add_argument("--drop", action="store_true", help="drop it instead")
    p.set_defaults(func=with_dsn(cmd_index))


def _jobs_page(args: argparse.Namespace, client: Client) -> int:
    """A page of jobs through the query API, or with --count their numbers."""
    statuses = args.status.split(",") if args.status else None
    if args.count:
        if args.since is not None or args.error is not None:
            # Counts are by status, type and queue: a filter they cannot apply is refused
            # rather than left out of a number that would then look filtered.
            raise InvalidInput(
                "--count counts by --status, --type and --queue only: drop --since/--error, or list the jobs"
            )
        counts = client.counts(status=statuses, type=args.type, queue=args.queue)
        return _print_counts(counts, as_json=args.json)
    since = None
    if args.since is not None:
        ago = timedelta(seconds=parse_duration(args.since))
        # By the database's clock, as every time of the queue: this machine's may be off.
        since = client.run(now_call()) - ago
    page = client.jobs(status=statuses, type=args.type, queue=args.queue, since=since, error=args.error,
                      limit=args.limit, before=args.before)  # fmt: skip
    if args.json:
        from dataclasses import asdict

        print_json([{**asdict(j), "status": j.status.value} for j in page])
        return 0
    table = Table("id", "type", "status", "attempts", "created", "worker", "last error", title="Jobs (newest first)")
    for j in page:
        attempts = f"{j.attempts}/{j.max_attempts if j.max_attempts is not None else '-'}"
        created = j.created_at.isoformat(timespec="seconds")
        table.add_row(str(j.id), j.type, j.status.value, attempts, created, j.worker or "-", j.last_error or "-")
    ops.wide_console().print(table)
    if len(page) == args.limit:
        print(f"older jobs: add --before {page[-1].id}")
    return 0


def _print_counts(counts: list[JobCount], *, as_json: bool) -> int:
    """`jobtui jobs --count`: jobs by status and type, as a table or as JSON."""
    if as_json:
        print_json([{"status": c.status.value, "type": c.type, "jobs": c.jobs} for c in counts])
        return 0
    table = Table("status", "type", "jobs", title="Jobs by status and type")
    for c in counts:
        table.add_row(c.status.value, c.type, str(c.jobs))
    ops.wide_console().print(table)
    print(f"{sum(c.jobs for c in counts)} job(s)")
    return 0
