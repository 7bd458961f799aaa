"""`jobtui enqueue` and `jobtui job`: add one job, explain one job from its row."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from jobtui.cli.args import job_id, open_client, parse_payload, positive_int
from jobtui.cli.output import print_json
from jobtui.kernel.domain import DEFAULT_QUEUE
from jobtui.kernel.durations import parse_duration
from jobtui.kernel.errors import UnknownJob
from jobtui.kernel.explain import explain


def add_enqueue_parser(sub: Any) -> None:
    p = sub.add_parser("enqueue", help="add a job")
    p.add_argument("type", help="job type, e.g. email.send")
    p.add_argument("--payload", default="{}", help="JSON payload (default {})")
    p.add_argument("--key", help="idempotency key: a second enqueue with it returns the first job")
    p.add_argument("--delay", default="0", help="run after this long, e.g. 30s, 5m")
    p.add_argument("--max-attempts", type=positive_int, help="attempts before dead (default: the handler's)")
    p.add_argument("--queue", help=f"the job's queue (default: {DEFAULT_QUEUE})")
    p.set_defaults(func=cmd_enqueue)


def add_job_parser(sub: Any) -> None:
    p = sub.add_parser("job", help="explain one job from its row")
    p.add_argument("id", type=job_id)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_job)


def cmd_enqueue(args: argparse.Namespace) -> int:
    payload = parse_payload(args.payload)
    delay = parse_duration(args.delay)
    with open_client(args) as client:
        new_id = client.enqueue(
            args.type, payload, key=args.key, delay=delay, max_attempts=args.max_attempts, queue=args.queue
        )
    print(new_id)
    return 0


def cmd_job(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        job = client.get(args.id)
    if job is None:
        raise UnknownJob(
            f"no job with id {args.id} in schema {args.schema!r} (finished jobs leave it when archived, or at once"
            " with workers started with --delete-on-complete); list jobs with `jobtui stats`"
        )
    if args.json:
        print_json(_job_json(job))
    else:
        print("\n".join(explain(job)))
    return 0


def _job_json(job: Any) -> dict[str, Any]:
    data = asdict(job)
    data["status"] = job.status.value
    return data
