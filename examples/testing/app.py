"""A small application: signing up a user enqueues a welcome email in the same transaction."""

from typing import Any

import psycopg

import jobtui

jobs = jobtui.Jobs()
sent: list[str] = []  # where the "email" goes, for the example


def signup(conn: psycopg.Connection[Any], client: jobtui.Client, name: str) -> None:
    conn.execute("INSERT INTO app_user (name) VALUES (%s)", (name,))
    client.enqueue("email.welcome", {"name": name}, conn=conn)


@jobs.handler("email.welcome", max_attempts=3)
def welcome(job: jobtui.Job) -> None:
    if not job.payload["name"]:
        raise jobtui.Permanent("no name to greet")
    sent.append(f"welcome, {job.payload['name']}")
