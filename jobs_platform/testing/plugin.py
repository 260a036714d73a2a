"""The pytest plugin for apps built on jobs-platform (registered by the ``pytest11`` entry point).

Fixtures (all prefixed ``jobs_``; nothing is autouse, so a suite that requests none of
them is not touched)::

    jobs_redis_url      session  a Redis of the session's own: a private redis-server, or a
                                 database claimed on the server JOBS_TEST_REDIS names
    jobs_database_url   session  the platform's tables, migrated (JOBS_TEST_DATABASE)
    jobs_env            session  JOBS_BROKER_URL/RESULT_BACKEND/DATABASE_URL set in this
                                 process for the session; the dict (plus PYTHONPATH) for workers
    jobs_app            session  jobs_app("myproj.jobs") -> the app, loaded as ``celery -A`` does
    jobs_worker         function jobs_worker("myproj.jobs", "fast") -> a real worker process
                                 with that queue's profile, stopped at teardown
    jobs_clock          function a FakeClock

A test that used ``jobs_worker`` and failed gets each worker's log in its report.
``docs/testing.md`` has the whole story.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import os
import shutil
import site
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from jobs_platform.errors import ConfigError
from jobs_platform.testing.clock import FakeClock
from jobs_platform.testing.processes import WorkerProcess
from jobs_platform.testing.redis_db import session_redis
from jobs_platform.urls import masked

REDIS_OPTION = ("JOBS_TEST_REDIS", "jobs_test_redis")
DATABASE_OPTION = ("JOBS_TEST_DATABASE", "jobs_test_database")
STARTUP_OPTION = "jobs_env_at_startup"
LOG_TAIL_CHARS = 6000


@dataclasses.dataclass(frozen=True)
class JobsServices:
    """The services of one test session and the ``JOBS_*`` variables that point at them."""

    redis_url: str
    database_url: str

    @property
    def environ(self) -> dict[str, str]:
        # An empty result backend means the broker: results stay in the session's database
        # even when the shell exports a JOBS_RESULT_BACKEND of its own.
        return {
            "JOBS_BROKER_URL": self.redis_url,
            "JOBS_RESULT_BACKEND": "",
            "JOBS_DATABASE_URL": self.database_url,
        }


_STARTUP_SERVICES = pytest.StashKey[JobsServices]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        REDIS_OPTION[1],
        "jobs-platform: Redis server for tests (redis://host:port: an empty database "
        "there is claimed and flushed; or 'private'); JOBS_TEST_REDIS wins. Default: a "
        "private redis-server, never a Redis that merely answers on 6379.",
        default="",
    )
    parser.addini(
        DATABASE_OPTION[1],
        "jobs-platform: database URL for the platform's tables in tests; JOBS_TEST_DATABASE "
        "wins. Default: a SQLite file in the session's temporary directory.",
        default="",
    )
    parser.addini(
        STARTUP_OPTION,
        "jobs-platform: set the JOBS_* test environment before collection, so app modules "
        "imported at the top of test modules use the test's services.",
        type="bool",
        default=False,
    )


def pytest_configure(config: pytest.Config) -> None:
    if not config.getini(STARTUP_OPTION):
        return
    stack = contextlib.ExitStack()
    config.add_cleanup(stack.close)
    scratch = tempfile.mkdtemp(prefix="jobs-test-")
    stack.callback(shutil.rmtree, scratch, ignore_errors=True)
    try:
        services = stack.enter_context(_services(config, Path(scratch)))
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from exc
    config.stash[_STARTUP_SERVICES] = services


@contextlib.contextmanager
def _services(config: pytest.Config, scratch: Path) -> Iterator[JobsServices]:
    """Claim the session's services and point this process's ``JOBS_*`` variables at them."""
    with contextlib.ExitStack() as stack:
        redis_url = stack.enter_context(session_redis(_option(config, REDIS_OPTION)))
        database_url = _option(config, DATABASE_OPTION) or f"sqlite:///{scratch}/jobs.sqlite3"
        services = JobsServices(redis_url, database_url)
        patch = stack.enter_context(pytest.MonkeyPatch.context())
        for name, value in services.environ.items():
            patch.setenv(name, value)
        yield services


def _option(config: pytest.Config, option: tuple[str, str]) -> str | None:
    env_name, ini_name = option
    value = os.environ.get(env_name) or str(config.getini(ini_name) or "")
    return value.strip() or None


@pytest.fixture(scope="session")
def _jobs_services(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[JobsServices]:
    """The session's services: claimed at start-up (``jobs_env_at_startup``) or here."""
    started = request.config.stash.get(_STARTUP_SERVICES, None)
    if started is not None:
        yield started
        return
    with contextlib.ExitStack() as stack:
        try:
            services = stack.enter_context(
                _services(request.config, tmp_path_factory.mktemp("jobs-db"))
            )
        except ConfigError as exc:
            unavailable = str(exc)
        else:
            yield services
            return
    pytest.fail(unavailable, pytrace=False)


@pytest.fixture(scope="session")
def jobs_redis_url(_jobs_services: JobsServices) -> str:
    """A Redis database no other session uses (claimed with a key, flushed at the end)."""
    return _jobs_services.redis_url


@pytest.fixture(scope="session")
def jobs_database_url(_jobs_services: JobsServices) -> str:
    """The database of the platform's tables, migrated once before any worker starts
    (workers starting together would otherwise race on a new SQLite file)."""
    from jobs_platform import db

    db.upgrade(_jobs_services.database_url)
    return _jobs_services.database_url


@pytest.fixture(scope="session")
def jobs_env(_jobs_services: JobsServices, jobs_database_url: str) -> dict[str, str]:
    """The ``JOBS_*`` variables of the session (already set in this process), plus the
    ``PYTHONPATH`` a worker process needs to import the app as this process does."""
    return {**_jobs_services.environ, "PYTHONPATH": import_path()}


@pytest.fixture(scope="session")
def jobs_app(jobs_env: dict[str, str]) -> Callable[[str], Any]:
    """``jobs_app("myproj.jobs")``: the app of a module path, found as ``celery -A`` finds it,
    after the session's ``JOBS_*`` variables are set; refused if it talks to other services."""

    def load(path: str) -> Any:
        from celery.app.utils import find_app

        app = find_app(path)
        _refuse_other_services(app, path, jobs_env)
        return app

    return load


class WorkerFactory:
    """What ``jobs_worker`` is: starts workers with the test's environment, stops them all."""

    def __init__(self, env: Mapping[str, str], *, cwd: Path, log_dir: Path) -> None:
        self.env = dict(env)
        self.cwd = cwd
        self.log_dir = log_dir
        self.started: list[WorkerProcess] = []

    def __call__(
        self,
        app: str,
        queue: str,
        *,
        concurrency: int | None = None,
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
        timeout_s: float = 60,
    ) -> WorkerProcess:
        """Start ``celery -A app worker`` with ``queue``'s profile (as ``worker-profile``
        does; ``concurrency`` defaults to the profile's) and wait until it is ready."""
        if not isinstance(app, str):
            raise TypeError(
                f"jobs_worker takes the app's module path, as `celery -A` does "
                f"(e.g. 'myproj.jobs'), not {app!r}"
            )
        loaded = _already_imported(app)
        if loaded is not None:
            _refuse_other_services(loaded, app, self.env)
        worker = WorkerProcess.for_profile(
            app,
            queue,
            concurrency=concurrency,
            hostname=f"{queue}-{uuid.uuid4().hex[:6]}@jobs-test",
            extra_args=extra_args,
            env={**self.env, **(env or {})},
            cwd=str(self.cwd),
            log_dir=str(self.log_dir),
        )
        self.started.append(worker)
        worker.start(timeout_s=timeout_s)
        return worker

    def stop_all(self) -> None:
        # A warm shutdown takes seconds even when idle: stop them side by side.
        with concurrent.futures.ThreadPoolExecutor(max(len(self.started), 1)) as pool:
            list(pool.map(WorkerProcess.stop, self.started))


@pytest.fixture()
def jobs_worker(
    jobs_env: dict[str, str], request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[WorkerFactory]:
    """``jobs_worker("myproj.jobs", "fast", concurrency=1)`` -> a started
    :class:`WorkerProcess`; every worker started is stopped when the test ends."""
    factory = WorkerFactory(jobs_env, cwd=request.config.rootpath, log_dir=tmp_path / "workers")
    try:
        yield factory
    finally:
        factory.stop_all()


@pytest.fixture()
def jobs_clock() -> FakeClock:
    """A :class:`FakeClock` at 2026-01-01T00:00:00Z, monotonic 0.0."""
    return FakeClock()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    factory = getattr(item, "funcargs", {}).get("jobs_worker")
    if report.failed and isinstance(factory, WorkerFactory):
        for worker in factory.started:
            tail = worker.log()[-LOG_TAIL_CHARS:]
            report.sections.append((f"jobs worker {worker.hostname} log (tail)", tail))
    return report


def check_services(app: Any, path: str, env: Mapping[str, str]) -> None:
    """Refuse an app whose settings point away from the test's services (it was created
    before they were set), instead of letting its jobs vanish into another database."""
    settings = getattr(app, "jobs_settings", None)
    if settings is None:
        raise ConfigError(f"{path}: {app!r} was not made by jobs_platform.create_app()")
    wrong = [
        f"  {what} {masked(have)} (the test's: {masked(want)})"
        for what, have, want in (
            ("broker", settings.broker_url, env["JOBS_BROKER_URL"]),
            ("database", settings.database_url, env["JOBS_DATABASE_URL"]),
        )
        if have != want
    ]
    if wrong:
        raise ConfigError(
            f"{path} was imported before the test's JOBS_* environment was set (at collection?),"
            " so its app uses other services:\n" + "\n".join(wrong) + "\nImport it inside the "
            f"test or through the jobs_app fixture, or set `{STARTUP_OPTION} = true` in the "
            "pytest configuration."
        )


def _refuse_other_services(app: Any, path: str, env: Mapping[str, str]) -> None:
    # A usage error in the test, not a defect of the code under test: no traceback.
    try:
        check_services(app, path, env)
    except ConfigError as exc:
        refused = str(exc)
    else:
        return
    pytest.fail(refused, pytrace=False)


def _already_imported(path: str) -> Any:
    """The app of ``path`` if its module is imported in this process, else ``None``."""
    module = path.split(":", 1)[0]
    if module not in sys.modules:
        return None
    from celery.app.utils import find_app

    return find_app(path)


def import_path() -> str:
    """This process's import path minus the interpreter's own directories, so a worker
    imports the app the way the tests do (``pythonpath =``, rootdir, editable installs)
    without reordering the standard library and site-packages."""
    own = {
        os.path.realpath(p)
        for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)
    }
    with contextlib.suppress(AttributeError):
        own.add(os.path.realpath(site.getusersitepackages()))

    def interpreter_owned(entry: str) -> bool:
        return any(entry == root or entry.startswith(root + os.sep) for root in own)

    entries = (os.path.realpath(entry or os.curdir) for entry in sys.path)
    kept = [e for e in dict.fromkeys(entries) if os.path.isdir(e) and not interpreter_owned(e)]
    return os.pathsep.join(kept)
