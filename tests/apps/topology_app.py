"""The app of the topology tests and of bench/pooler.py: through PgBouncer in transaction
mode and through a failover, each job records its effect once, on the same DSN as the
worker's (JOBTUI_DSN), and a schedule ticks every second so that a scheduler works too.

    effect_log(key, job_id, attempt)   no unique key: a duplicated effect shows as two rows
"""

from __future__ import annotations

import os

import psycopg

from jobtui.core.registry import Job, Jobs
from jobtui.kernel.backoff import BackoffPolicy

APP_TABLES = "CREATE TABLE effect_log (id bigserial PRIMARY KEY, key text NOT NULL, job_id bigint, attempt int);"

jobs = Jobs()


@jobs.handler("topo.effect", backoff=BackoffPolicy(base=0.1, cap=0.5))
async def effect(job: Job) -> None:
    """Record effect `key` once. No prepared statements: the DSN may be a pooler's."""
    async with await psycopg.AsyncConnection.connect(os.environ["JOBTUI_DSN"], prepare_threshold=None) as conn:
        if await job.once_async(conn, job.payload["key"]):
            await conn.execute(
                "INSERT INTO effect_log (key, job_id, attempt) VALUES (%s, %s, %s)",
                (job.payload["key"], job.id, job.attempt),
            )


@jobs.handler("topo.noop")
async def noop(job: Job) -> None:
    return None


@jobs.handler("topo.tick")
async def tick(job: Job) -> None:
    return None


jobs.schedule("topo.tick", cron="* * * * * *", type="topo.tick")
