"""Tasks that die with exceptions Celery cannot pickle, for the dead-letter identity tests.

The worker reads ``JOBS_BROKER_URL`` and ``JOBS_DATABASE_URL`` from its environment (the
test's own Redis and database). urllib's ``HTTPError`` carries its open response body and
:class:`PartnerStatusError` (shaped like httpx's ``HTTPStatusError``) needs keyword-only
arguments: Celery replaces both with a pickleable stand-in before ``task_failure`` fires.
"""

from __future__ import annotations

import email.message
import io
import urllib.error
from types import SimpleNamespace

from jobs_platform import ReliableTask, create_app

app = create_app("identityapp", retry_backoff=0.2, retry_backoff_max=0.4, dlq_drain_interval=0.5)


class PartnerStatusError(Exception):
    """Like ``httpx.HTTPStatusError``: the request and response are keyword-only."""

    def __init__(self, message: str, *, request: object, response: object) -> None:
        super().__init__(message)
        self.request = request
        self.response = response


@app.task(base=ReliableTask, name="identity.urllib", queue="thirdparty", max_retries=0)
def urllib_error(key: str, status: int) -> None:
    headers = email.message.Message()
    headers["Content-Type"] = "text/plain"
    raise urllib.error.HTTPError(
        f"http://127.0.0.1/partner/{key}",
        status,
        "Service Unavailable" if status == 503 else "Not Found",
        headers,
        io.BytesIO(b"partner says no"),
    )


@app.task(base=ReliableTask, name="identity.partner", queue="thirdparty", max_retries=0)
def partner_error(key: str, status: int) -> None:
    url = f"http://127.0.0.1/charge/{key}"
    request = SimpleNamespace(method="POST", url=url)
    response = SimpleNamespace(status_code=status, headers={}, request=request)
    phrase = "Service Unavailable" if status == 503 else "Not Found"
    # Quoted like httpx's message: normalised, a 404 and a 503 read the same.
    raise PartnerStatusError(
        f"Partner error '{status} {phrase}' for url '{url}'", request=request, response=response
    )
