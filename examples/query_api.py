"""The job query API and what code that deploys itself needs: migrate, check, count, list.
Run: JOBTUI_DSN=postgresql://... python examples/query_api.py"""

import os

import jobtui

dsn = os.environ["JOBTUI_DSN"]
jobtui.migrate_schema(dsn)  # what `jobtui migrate` does; safe to race
jobtui.check_schema(dsn)  # SchemaNotMigrated if the schema is older than this code

with jobtui.Client(dsn) as client:
    client.enqueue_many(
        [jobtui.NewJob("email.send", {"n": i}, queue="mail") for i in range(5)] + [jobtui.NewJob("sms.send")]
    )
    print("ready in the mail queue:", client.count(status="ready", queue="mail"))
    for c in client.counts(status="ready"):
        print(f"  {c.type}: {c.jobs}")
    page = client.jobs(type="email.send", limit=2)  # newest first
    while page:
        print("page:", [j.id for j in page], "created", page[0].created_at <= page[0].run_at)
        page = client.jobs(type="email.send", limit=2, before=page[-1].id)
