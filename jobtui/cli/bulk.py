"""`jobtui bulk requeue|discard|cancel`: a bulk action over any filter, in batches (bulk.py),
counted first, asked before, with a progress bar on stderr; Ctrl-C stops it between two
batches, and the same command again resumes it. The run changes only the jobs its count
could see: those that matched since are left, and it says how many."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import psycopg

from jobtui.cli.args import add_error_option, positive_int, with_dsn
from jobtui.cli.search import progress_bar
from jobtui.core import bulk
from jobtui.kernel.db import connect
from jobtui.kernel.durations import parse_duration
from jobtui.kernel.errors import DatabaseUnavailable, InvalidInput, first_line
from jobtui.kernel.jobfilter import JobFilter, payload_of
from jobtui.kernel.safetext import line

VERBS = {"requeue": "requeue", "discard": "delete", "cancel": "cancel"}


def bulk_filter(args: argparse.Namespace) -> JobFilter:
    return JobFilter(
        statuses=tuple(s for s in (args.status or "").split(",") if s),
        types=tuple(args.type or ()),
        queue=args.queue,
        error=args.error,
        payload=payload_of(args.payload, args.payload_path or ()),
        older_than=None if args.older_than is None else parse_duration(args.older_than),
        newer_than=None if args.since is None else parse_duration(args.since),
    )


def _ask(question: str) -> bool:
    if not sys.stdin.isatty():
        raise InvalidInput(f"{question}: add --yes to go on without asking (stdin is not a terminal)")
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def cmd_bulk(args: argparse.Namespace, dsn: str) -> int:
    filt = bulk_filter(args)
    if filt.empty and not args.all:
        raise InvalidInput("say which jobs: --type, --queue, --status, --error, --payload, --older-than ... or --all")
    action = args.bulk_action
    with connect(dsn, autocommit=True, pooler=args.pooler) as conn:
        job = bulk.Bulk(conn, action, filt, actor=args.actor, schema=args.schema, batch=args.batch,
                        timeout=parse_duration(args.timeout), rest=args.rest)  # fmt: skip
        pending = job.pending()
        what = f"{' and '.join(bulk.SCOPE[job.action])} jobs matching {filt.describe()}"
        tally: bulk.Tally | None = None
        if pending is not None:
            said = (
                f"resuming bulk run {pending.id} ({pending.state}, started by {pending.started_by} at"
                f" {pending.started_at:%Y-%m-%d %H:%M:%S}): {pending.changed:,} {bulk.PAST[job.action]} so far"
            )
            print(line(said), file=sys.stderr)
        else:
            with progress_bar("counting") as update:
                tally = job.tally(progress=lambda done, n: update(done, f"{n:,} found"))
            count = tally.jobs
            if args.dry_run:
                print(line(f"would {VERBS[action]} {count:,} {what} (dry run, nothing changed)"))
                return 0
            if count == 0:
                print(line(f"no {what}: nothing to {VERBS[action]}"))
                return 0
            question = f"{VERBS[action].capitalize()} {count:,} {what}, {args.batch:,} per transaction?"
            if not args.yes and not _ask(line(question)):
                print("nothing changed", file=sys.stderr)
                return 1
        if args.dry_run:
            print(line(f"a run of this filter is pending ({pending.id if pending else '-'}): run without --dry-run"))
            return 0
        # At the count's mark: a job that matched after the count (while the question was
        # asked) is not changed by a run the count did not show.
        started = job.start(None if tally is None else tally.mark)
        try:
            with progress_bar(bulk.PAST[job.action]) as update:
                outcome = job.run(started, progress=lambda done, n: update(done, f"{n:,} {bulk.PAST[job.action]}"))
        except KeyboardInterrupt:
            print(
                f"jobtui: stopped (Ctrl-C); bulk run {started.id} keeps what it did: the same command resumes it",
                file=sys.stderr,
            )
            return 130
        later: int | None = None
        try:
            with progress_bar("counting what matched since") as update:
                later = job.tally(started.mark, progress=lambda done, n: update(done)).later
        except KeyboardInterrupt:
            pass  # the run is done; only this count was stopped
        except (psycopg.Error, DatabaseUnavailable) as exc:
            # The run is done and audited: a count after it that fails does not undo that.
            print(
                line(f"jobtui: could not count the jobs that matched after the run ({first_line(exc)})"),
                file=sys.stderr,
            )
    counted = None if tally is None or outcome.resumed else tally.jobs
    print(line(bulk.outcome_line(job.action, outcome, counted, later, "run the command again")))
    return 0


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("bulk", help="requeue, discard or cancel every job of a filter, in batches, resumable")
    bsub = p.add_subparsers(dest="bulk_action", metavar="ACTION", required=True)
    for action, text in (
        ("requeue", "dead and failed jobs back to ready, with a fresh set of attempts"),
        ("discard", "delete dead and failed jobs"),
        ("cancel", "ready and running jobs become failed (a running one's worker stops it)"),
    ):
        a = bsub.add_parser(action, help=text)
        a.add_argument("--type", action="append", help="only this job type (repeatable)")
        a.add_argument("--queue", help="only this queue")
        a.add_argument("--status", help="only these statuses, comma-separated (of those the action applies to)")
        add_error_option(a, "only jobs whose error matches PATTERN")
        a.add_argument("--payload", metavar="JSON", help="only jobs whose payload contains this JSON object")
        a.add_argument("--payload-path", action="append", metavar="KEY=VALUE", help="payload KEY (a.b nests) is VALUE")
        a.add_argument("--older-than", metavar="DURATION", help="only jobs enqueued longer ago than this, e.g. 1h")
        a.add_argument("--since", metavar="DURATION", help="only jobs enqueued this long ago or less, e.g. 30m")
        a.add_argument("--all", action="store_true", help="with no other filter: every job the action applies to")
        a.add_argument("--dry-run", action="store_true", help="count, change nothing")
        a.add_argument("--yes", action="store_true", help="do not ask first (scripts)")
        a.add_argument(
            "--batch", type=positive_int, default=bulk.BATCH, help=f"jobs per transaction (default {bulk.BATCH})"
        )
        a.add_argument("--timeout", default="30s", help="the longest one batch may take (default 30s)")
        a.add_argument(
            "--rest",
            type=float,
            default=bulk.REST,
            help=f"after each batch, rest this many times as long as it took, so workers keep the database"
            f" (default {bulk.REST:g}; 0: as fast as it goes)",
        )
        a.set_defaults(func=with_dsn(cmd_bulk))
