"""A dead letter keeps the failure's real identity, whatever Celery substitutes on the way.

A real prefork worker, a private Redis and real PostgreSQL: tasks raise HTTP errors that
cannot be pickled (urllib's ``HTTPError`` holds its open response; an httpx-style error
needs keyword-only arguments). Celery hands ``task_failure`` a pickleable stand-in
(``OSError()``, ``Exception(...)``); the row must still name the original type, message,
status and outcome, and a 404 and a 503 of the same task must not share a fingerprint.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from typing import Any

import pytest

from jobs_platform.deadletter.store import DeadLetterStore
from jobs_platform.testing import RedisServer, WorkerProcess
from tests.acceptance.conftest import ROOT
from tests.acceptance.test_deadletter import dlq_env, release_results, rows_for

pytestmark = pytest.mark.acceptance

APP = "tests.support.identity_app"


@pytest.fixture(scope="module")
def env(module_pg_url: str) -> Iterator[dict[str, str]]:
    # A broker of our own: nothing else may consume this module's queue.
    with RedisServer() as server:
        yield dlq_env(server.url, module_pg_url)


@pytest.fixture(scope="module")
def app_module(env: dict[str, str]) -> Iterator[Any]:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        from tests.support import identity_app

        module = importlib.reload(identity_app)  # configured from this module's env
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    yield module
    release_results(module.app)


@pytest.fixture(scope="module")
def worker(
    env: dict[str, str], app_module: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    with WorkerProcess(
        APP,
        ["thirdparty"],
        env=env,
        cwd=str(ROOT),
        concurrency=2,
        log_dir=str(tmp_path_factory.mktemp("idw")),
    ) as proc:
        yield proc


@pytest.fixture(scope="module")
def store(module_pg_url: str) -> DeadLetterStore:
    return DeadLetterStore(module_pg_url)


def final_error(row: dict[str, Any]) -> dict[str, Any]:
    assert row["errors"], row
    return dict(row["errors"][-1])


def test_unpicklable_http_errors_keep_type_message_status_and_outcome(
    app_module: Any, worker: WorkerProcess, store: DeadLetterStore
) -> None:
    unavailable = app_module.urllib_error.delay("u1", 503).id
    not_found = app_module.urllib_error.delay("u2", 404).id

    [row_503] = rows_for(store, unavailable)
    [row_404] = rows_for(store, not_found)

    # 503: the classifier chose to retry, and max_retries=0 left no retry to run.
    assert row_503["reason"] == "exhausted", row_503["errors"]
    assert row_503["error_type"] == "urllib.error.HTTPError"
    assert "503" in row_503["error_message"]
    assert final_error(row_503)["status"] == 503
    assert final_error(row_503)["type"] == "urllib.error.HTTPError"

    # 404: the caller's fault, failed at once.
    assert row_404["reason"] == "permanent", row_404["errors"]
    assert row_404["error_type"] == "urllib.error.HTTPError"
    assert "404" in row_404["error_message"]
    assert final_error(row_404)["status"] == 404

    # Same task, same wording apart from the number: still two causes, two fingerprints.
    assert row_503["fingerprint"] != row_404["fingerprint"]
    assert worker.alive


def test_httpx_style_errors_keep_their_identity_and_one_fingerprint_per_cause(
    app_module: Any, worker: WorkerProcess, store: DeadLetterStore
) -> None:
    sent = {
        "503-a": app_module.partner_error.delay("p1", 503).id,
        "503-b": app_module.partner_error.delay("p2", 503).id,
        "404": app_module.partner_error.delay("p3", 404).id,
    }
    rows = {name: rows_for(store, task_id)[0] for name, task_id in sent.items()}

    row = rows["503-a"]
    assert row["reason"] == "exhausted", row["errors"]
    assert row["error_type"] == "tests.support.identity_app.PartnerStatusError"
    assert "Partner error '503 Service Unavailable'" in row["error_message"]
    assert final_error(row)["status"] == 503
    assert (rows["404"]["reason"], final_error(rows["404"])["status"]) == ("permanent", 404)

    # The messages normalise to the same text ("Partner error <str> for url <str>"):
    # the same cause about another record groups, a different status and outcome do not.
    assert rows["503-b"]["fingerprint"] == row["fingerprint"]
    assert rows["404"]["fingerprint"] != row["fingerprint"]
