"""Typed payloads with pydantic: checked at enqueue, decoded for the handler.
Run: JOBTUI_DSN=postgresql://... python examples/typed_payloads.py"""

import os

import pydantic

import jobtui
from jobtui.testing import drain


class Welcome(pydantic.BaseModel):
    user_id: int
    name: str


jobs = jobtui.Jobs()


@jobs.handler("email.welcome", payload=Welcome)
def welcome(job: jobtui.Job) -> None:
    data: Welcome = job.payload
    print(f"welcome, {data.name} (user {data.user_id})")


dsn = os.environ["JOBTUI_DSN"]
with jobtui.Client(dsn, middleware=[jobtui.checked_payloads(jobs)]) as client:
    client.enqueue("email.welcome", Welcome(user_id=1, name="ada"))
    try:
        client.enqueue("email.welcome", {"user_id": "one"})
    except jobtui.InvalidInput as exc:
        print(f"refused: {exc}")
drain(jobs, dsn)
