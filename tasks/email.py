"""fast queue: send a welcome email.

The "mail server" is an outbox directory; the message file name is derived from the
user id, so a redelivered task rewrites the same file instead of sending a second mail.
"""

from __future__ import annotations

from typing import Any

from jobs_platform import PermanentError, ReliableTask
from tasks.jobs import app
from tasks.paths import atomic_write, data_dir


def lookup_email(user_id: int) -> str:
    if user_id <= 0:
        raise PermanentError(f"user {user_id} does not exist")
    return f"user{user_id}@example.com"


@app.task(
    base=ReliableTask, bind=True, name="tasks.email.send_welcome_email", queue="fast", max_retries=5
)
def send_welcome_email(self: Any, user_id: int) -> str:
    address = lookup_email(user_id)
    path = data_dir() / "outbox" / f"welcome-{user_id}.eml"
    atomic_write(path, f"To: {address}\nSubject: Welcome!\n\nHello user {user_id}.\n".encode())
    return str(path)


# -- a payload that changed: version 1 sent (user_id, full_name) --------------------------------


def split_full_name(args: Any, kwargs: Any) -> tuple[Any, Any]:
    """Version 1's ``(user_id, full_name)`` as version 2's ``(user_id, given_name,
    family_name)``: jobs queued (or delayed) by version-1 code still run after the deploy."""
    user_id, full_name = args
    given, _, family = str(full_name).partition(" ")
    return (user_id, given, family), kwargs


@app.task(
    base=ReliableTask,
    bind=True,
    name="tasks.email.send_greeting_email",
    queue="fast",
    version=2,
    upcast={1: split_full_name},
)
def send_greeting_email(self: Any, user_id: int, given_name: str, family_name: str) -> str:
    address = lookup_email(user_id)
    path = data_dir() / "outbox" / f"greeting-{user_id}.eml"
    body = f"To: {address}\nSubject: Hello {given_name}\n\nDear {given_name} {family_name},\n"
    atomic_write(path, body.encode())
    return str(path)
