"""Enqueue inside a Django transaction (the postgresql backend on psycopg 3).

Run: JOBTUI_DSN=postgresql://... python examples/django_enqueue.py (after `jobtui migrate`)
"""

import os

import django
from django.conf import settings
from psycopg.conninfo import conninfo_to_dict

import jobtui

dsn = os.environ["JOBTUI_DSN"]
params = conninfo_to_dict(dsn)
settings.configure(
    DATABASES={
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": params["dbname"],
            "USER": params.get("user", ""),
            "HOST": params.get("host", ""),
            "PORT": params.get("port", ""),
        }
    }
)
django.setup()

from django.db import connection, transaction  # noqa: E402  (after settings)

client = jobtui.Client(dsn)
with connection.cursor() as cur:
    cur.execute("CREATE TABLE IF NOT EXISTS app_user (name text PRIMARY KEY)")

with transaction.atomic():
    with connection.cursor() as cur:
        cur.execute("INSERT INTO app_user VALUES ('ada')")
    kept = client.enqueue("email.welcome", {"name": "ada"}, conn=connection)


class Undo(Exception):
    pass


try:
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("INSERT INTO app_user VALUES ('bob')")
        dropped = client.enqueue("email.welcome", {"name": "bob"}, conn=connection)
        raise Undo  # the view failed: the user and the job roll back together
except Undo:
    pass

assert client.get(kept) is not None and client.get(dropped) is None
print(f"kept job {kept}, rolled back job {dropped}")
client.close()
