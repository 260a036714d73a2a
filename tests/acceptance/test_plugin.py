"""The pytest plugin as a team uses it: a project outside this repository (``myproj``) whose own
test suite, run by pytest in a subprocess, gets its fixtures from the ``pytest11`` entry point
alone (no conftest, no import of ours), starts a real worker with a queue's profile,
dispatches, and asserts the dead letter.
"""

from __future__ import annotations

import json
import os
import re
import textwrap
import urllib.parse

import pytest
import redis

from jobs_platform.testing import free_port, port_answers
from tests.acceptance.conftest import ROOT
from tests.conftest import SHARED_REDIS

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.acceptance

JOBS_PY = """
from jobs_platform import PermanentError, ReliableTask, create_app

app = create_app("myproj")


@app.task(base=ReliableTask, queue="fast", max_retries=3)
def reject(order_id: int) -> None:
    raise PermanentError(f"order {order_id} is malformed")


@app.task(base=ReliableTask, queue="fast")
def accept(order_id: int) -> int:
    return order_id
"""

#: The team's tests, importing their app inside the test (the default mode).
LAZY_TESTS = """
import json

import redis

from jobs_platform.testing import assert_dead_lettered


def test_a_malformed_order_is_dead_lettered(jobs_app, jobs_worker, jobs_redis_url):
    app = jobs_app("myproj.jobs")
    worker = jobs_worker("myproj.jobs", "fast", concurrency=1)
    from myproj.jobs import reject

    result = reject.delay(41)
    row = assert_dead_lettered(app, result.id, reason="permanent", timeout_s=60)
    assert row["task_name"] == "myproj.jobs.reject"
    assert row["args"] == [41] and row["attempts"] == 1
    assert "order 41 is malformed" in row["error_message"]
    assert "concurrency: 1 (prefork)" in worker.log()
    # The result lives in the session's own Redis database (flushed at the end).
    client = redis.Redis.from_url(jobs_redis_url)
    assert client.exists(f"celery-task-meta-{result.id}")
    with open("session.json", "w") as out:
        json.dump({"redis_url": jobs_redis_url, "task_id": result.id}, out)


def test_a_wrong_expectation_fails_with_the_worker_log(jobs_app, jobs_worker):
    app = jobs_app("myproj.jobs")
    jobs_worker("myproj.jobs", "fast", concurrency=1)
    from myproj.jobs import accept

    result = accept.delay(7)
    assert result.get(timeout=60) == 7
    assert_dead_lettered(app, result.id, reason="permanent", timeout_s=1)
"""

#: The usual style: the app imported at the top of the test module.
TOP_IMPORT_TESTS = """
import os

from jobs_platform.testing import assert_dead_lettered
from myproj.jobs import app, reject

BROKER_AT_IMPORT = os.environ.get("JOBS_BROKER_URL")


def test_a_malformed_order_is_dead_lettered(jobs_worker, jobs_redis_url):
    jobs_worker("myproj.jobs", "fast", concurrency=1)
    assert BROKER_AT_IMPORT == jobs_redis_url == app.jobs_settings.broker_url
    result = reject.delay(42)
    assert assert_dead_lettered(app, result.id, reason="permanent", timeout_s=60)["args"] == [42]
"""


@pytest.fixture()
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """The team's repository: its package and nothing of ours on the path; no JOBS_* set."""
    for name in list(os.environ):
        if name.startswith("JOBS_") and name != "JOBS_TEST_REDIS":
            monkeypatch.delenv(name)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    pytester.mkpydir("myproj")
    (pytester.path / "myproj" / "jobs.py").write_text(textwrap.dedent(JOBS_PY))
    return pytester


def test_a_teams_suite_starts_a_worker_and_asserts_the_dead_letter(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A shared server named by JOBS_TEST_REDIS: the session claims a database there.
    monkeypatch.setenv("JOBS_TEST_REDIS", SHARED_REDIS)
    project.makeini("[pytest]\npythonpath = .\n")
    project.makepyfile(test_orders=LAZY_TESTS)
    result = project.runpytest_subprocess("-v", timeout=170)
    result.assert_outcomes(passed=1, failed=1)
    output = result.stdout.str()
    # The failing test says what it looked for and where, and shows the worker's log.
    assert "no dead letter with reason 'permanent' for task " in output
    assert "jobs worker fast-" in output and "log (tail)" in output
    assert "myproj.jobs.accept" in output and "succeeded in" in output
    # The session's Redis database was flushed when the session ended.
    seen = json.loads((project.path / "session.json").read_text())
    client = redis.Redis.from_url(seen["redis_url"])
    try:
        assert not client.exists(f"celery-task-meta-{seen['task_id']}")
    finally:
        client.close()


def test_an_app_imported_at_collection_is_refused_with_the_fix(project: pytest.Pytester) -> None:
    project.makeini("[pytest]\npythonpath = .\n")
    project.makepyfile(test_orders=TOP_IMPORT_TESTS)
    result = project.runpytest_subprocess(timeout=170)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*myproj.jobs was imported before the test's JOBS_* environment was set*",
            "*broker redis://*/0 (the test's: redis://*)",
            "*database sqlite:///jobs_platform.sqlite3 (the test's: sqlite:///*)",
            "*jobs_env_at_startup = true*",
        ]
    )
    assert "-jobs-test ready" not in result.stdout.str()  # refused before any worker started


def test_the_startup_option_serves_an_app_imported_at_collection(
    project: pytest.Pytester,
) -> None:
    project.makeini("[pytest]\npythonpath = .\njobs_env_at_startup = true\n")
    project.makepyfile(test_orders=TOP_IMPORT_TESTS)
    result = project.runpytest_subprocess(timeout=170)
    result.assert_outcomes(passed=1)


def test_a_suite_that_uses_no_jobs_fixture_is_untouched(project: pytest.Pytester) -> None:
    project.makeini("[pytest]\npythonpath = .\n")
    project.makepyfile(
        test_plain="""
        import os

        def test_plain():
            set_by_someone = [n for n in os.environ if n.startswith("JOBS_")]
            assert set_by_someone in ([], ["JOBS_TEST_REDIS"])
        """
    )
    result = project.runpytest_subprocess(timeout=170)
    result.assert_outcomes(passed=1)
    listed = project.runpytest_subprocess("--fixtures", timeout=170).stdout.str()
    for name in ("jobs_worker", "jobs_app", "jobs_env", "jobs_redis_url", "jobs_clock"):
        assert name in listed
    # ... and a project can switch the plugin off by its entry-point name.
    unlisted = project.runpytest_subprocess("--fixtures", "-p", "no:jobs_platform", timeout=170)
    assert "jobs_worker" not in unlisted.stdout.str()


REDIS_URL_TESTS = """
import redis


def test_session_redis(jobs_redis_url):
    client = redis.Redis.from_url(jobs_redis_url)
    assert client.ping()
    with open("redis_url.txt", "w") as out:
        out.write(jobs_redis_url)
"""


@pytest.mark.parametrize("configured", [None, "private"])
def test_a_private_redis_server_by_default_or_when_asked_and_stopped_after(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, configured: str | None
) -> None:
    # Without JOBS_TEST_REDIS the session never writes into the Redis on 6379 (it answers
    # here, and may be the one the team's app uses for real): a private redis-server.
    if configured is None:
        monkeypatch.delenv("JOBS_TEST_REDIS", raising=False)
    else:
        monkeypatch.setenv("JOBS_TEST_REDIS", configured)
    project.makepyfile(test_redis=REDIS_URL_TESTS)
    project.runpytest_subprocess(timeout=170).assert_outcomes(passed=1)
    url = urllib.parse.urlsplit((project.path / "redis_url.txt").read_text())
    assert url.hostname == "127.0.0.1" and url.port != 6379
    assert not port_answers("127.0.0.1", int(url.port or 0))


def test_a_configured_redis_that_does_not_answer_fails_the_fixture_by_name(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    nobody = free_port()
    monkeypatch.setenv("JOBS_TEST_REDIS", f"redis://:s3cret@127.0.0.1:{nobody}")
    project.makepyfile(test_redis=REDIS_URL_TESTS)
    result = project.runpytest_subprocess(timeout=170)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*the test Redis at redis://:***@127.0.0.1:{nobody} does not*"])
    assert "s3cret" not in result.stdout.str()


PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def python_blocks(path: str, after: str, until: str) -> list[str]:
    """The ```python blocks of ``path`` between the lines starting ``after`` and ``until``."""
    text = (ROOT / path).read_text(encoding="utf-8")
    start = text.index(after)
    return PYTHON_BLOCK.findall(text, start, text.index(until, start))


def test_the_documented_first_tests_run_as_written(project: pytest.Pytester) -> None:
    # docs/testing.md's app module and test, and the README's test, copied as they are
    # printed into a team's project and run by pytest there: with no fixture but the plugin's.
    files = {}
    for block in python_blocks("docs/testing.md", "## A first test", "\n## "):
        path, _, code = block.partition("\n")
        assert path.startswith("# "), f"a block of 'A first test' names its file: {path!r}"
        files[path[2:]] = code
    assert set(files) == {"myproj/jobs.py", "tests/test_orders.py"}
    [readme_test] = python_blocks("README.md", "**Testing your tasks**", "\n## ")
    files["tests/test_readme.py"] = readme_test
    for name, code in files.items():
        (project.path / name).parent.mkdir(parents=True, exist_ok=True)
        (project.path / name).write_text(code)
    project.makeini("[pytest]\npythonpath = .\n")
    result = project.runpytest_subprocess("-v", timeout=170)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "*tests/test_orders.py::test_a_malformed_order_is_dead_lettered PASSED*",
            "*tests/test_readme.py::test_a_malformed_order_is_dead_lettered PASSED*",
        ]
    )
