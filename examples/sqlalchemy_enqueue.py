"""Enqueue inside a SQLAlchemy transaction: the job commits or rolls back with the rows.

Run: JOBTUI_DSN=postgresql://... python examples/sqlalchemy_enqueue.py (after `jobtui migrate`)
"""

import os

import psycopg
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

import jobtui

dsn = os.environ["JOBTUI_DSN"]
# Any postgresql+psycopg:// URL works; `creator` takes the DSN in jobtui's own form.
engine = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(dsn))
client = jobtui.Client(dsn)

with engine.begin() as conn:
    conn.execute(text("CREATE TABLE IF NOT EXISTS app_user (name text PRIMARY KEY)"))

# A Session: the user and the job commit together.
with Session(engine) as session, session.begin():
    session.execute(text("INSERT INTO app_user VALUES ('ada')"))
    kept = client.enqueue("email.welcome", {"name": "ada"}, conn=session)

# A Connection whose transaction rolls back: neither the user nor the job is left.
with engine.connect() as conn:
    conn.execute(text("INSERT INTO app_user VALUES ('bob')"))
    dropped = client.enqueue("email.welcome", {"name": "bob"}, conn=conn)
    conn.rollback()

assert client.get(kept) is not None and client.get(dropped) is None
print(f"kept job {kept}, rolled back job {dropped}")
client.close()
