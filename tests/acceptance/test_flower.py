"""Flower as ``celery -A APP flower`` runs it: real Flower, real workers, a real browser.

Flower is a subprocess started with no flag but its port and address; everything else comes
from the environment (docs/flower.md). Workers are started with the command line the
profiles use (heartbeats on, gossip and mingle off) and the default JOBS_TASK_EVENTS=auto:
they send task events only once Flower has asked for them, so a test waits for that
before it runs a task it wants to see. Pages are read in headless Chromium
(Debian's package, installed here when missing) driven by Playwright: the workers and tasks
tables are filled by JavaScript, so only a browser shows what an operator sees.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis
from celery.events.state import HEARTBEAT_EXPIRE_WINDOW

from jobs_platform.testing import WorkerProcess, free_port, wait_for, workers
from tests.acceptance.conftest import ROOT, wait_state

pytestmark = pytest.mark.acceptance

APP = "tests.support.flower_app"
USER, PASSWORD = "ops", f"pw-{uuid.uuid4().hex[:12]}"
CHROMIUM_FLAGS = [
    "--no-sandbox",  # root in a container: Chromium's sandbox needs user namespaces
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


# --------------------------------------------------------------------------- Flower process


class FlowerProcess:
    """``celery -A APP flower --port=N --address=127.0.0.1`` in its own process group."""

    def __init__(self, env: dict[str, str], workdir: Path, name: str = "flower") -> None:
        self.port = free_port()
        self.env = env
        self.workdir = workdir
        self.log_path = workdir / f"{name}-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        # Tornado's parser wants --name=value (a separate value is refused).
        return [
            *(sys.executable, "-m", "celery", "-A", APP, "flower"),
            *(f"--port={self.port}", "--address=127.0.0.1"),
        ]

    def start(self, *, wait: bool = True) -> FlowerProcess:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.workdir,
                start_new_session=True,
            )
        if wait:
            wait_for(
                self._answers,
                timeout_s=60,
                interval_s=0.1,
                message=lambda: f"Flower on {self.url}:\n{self.log()[-3000:]}",
            )
        return self

    def _answers(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"Flower exited with {self.process.returncode}:\n{self.log()}")
        return get(f"{self.url}/healthcheck")[0] == 200

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_exit(self, timeout_s: float = 60) -> int:
        assert self.process is not None
        return self.process.wait(timeout_s)

    def stop(self) -> int | None:
        """SIGTERM (as ``docker stop``): Flower saves its state and exits."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)

    def __enter__(self) -> FlowerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def get(url: str, *, auth: tuple[str, str] | None = None) -> tuple[int, str]:
    """GET ``url`` (with basic auth if given): (status, body); (0, error) if nothing answers."""
    request = urllib.request.Request(url)
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode(errors="replace")
    except OSError as exc:
        return 0, str(exc)


def workers_json(flower: FlowerProcess) -> dict[str, dict[str, Any]]:
    """The workers table's own data source (``/workers?json=1``), by hostname."""
    status, body = get(f"{flower.url}/workers?json=1", auth=(USER, PASSWORD))
    assert status == 200, body
    return {row["hostname"]: row for row in json.loads(body)["data"]}


def online_status(flower: FlowerProcess) -> dict[str, bool]:
    """Flower's API view (the one the issue quoted): ``/api/workers?status=true``."""
    status, body = get(f"{flower.url}/api/workers?status=true", auth=(USER, PASSWORD))
    assert status == 200, body
    return {name: bool(alive) for name, alive in json.loads(body).items()}


# --------------------------------------------------------------------------- environment


@pytest.fixture()
def flower_env(worker_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """Flower's environment: the session's broker and database, our auth and state file.

    Any FLOWER_* of the shell is dropped: those would override the settings under test.
    """
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FLOWER_", "JOBS_FLOWER_"))}
    return {
        **base,
        **worker_env,
        "JOBS_FLOWER_BASIC_AUTH": f"{USER}:{PASSWORD}",
        "JOBS_FLOWER_DB": str(tmp_path / "flower.db"),
    }


def worker(env: dict[str, str], queues: list[str], tmp: Path, *extra: str) -> WorkerProcess:
    # The profiles' command line (jobs_platform.profiles.celery_worker_argv): heartbeats on.
    return WorkerProcess(
        APP,
        queues,
        concurrency=1,
        env=env,
        hostname=f"{queues[0]}-{uuid.uuid4().hex[:6]}@flowertest",
        extra_args=list(extra),
        cwd=str(ROOT),
        log_dir=str(tmp),
    )


@pytest.fixture(scope="module")
def flower_tasks(worker_env: dict[str, str]) -> Any:
    from tests.support import flower_app

    return flower_app


@pytest.fixture()
def redis_release(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


# --------------------------------------------------------------------------- the browser


def _install_chromium() -> str | None:
    """Debian's chromium, installed with apt when missing; None and a reason if impossible."""
    found = shutil.which("chromium")
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("chromium is missing and cannot be installed here (needs root and apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]
    attempt = subprocess.run(install, env=env, capture_output=True, text=True, timeout=900)
    if attempt.returncode != 0:  # a stale package list: refresh it once
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, timeout=600)
        attempt = subprocess.run(install, env=env, capture_output=True, text=True, timeout=900)
    if attempt.returncode != 0:
        pytest.skip(f"apt-get install chromium failed: {attempt.stderr[-1500:]}")
    return shutil.which("chromium")


@pytest.fixture(scope="session")
def chromium() -> str:
    path = _install_chromium()
    assert path, "chromium installed but not on PATH"
    return path


@pytest.fixture(scope="module")
def browser(chromium: str) -> Iterator[Any]:
    # Playwright drives the system browser: `playwright install` (a download) is never needed.
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        yield launched
        launched.close()


@contextlib.contextmanager
def page(browser: Any, *, credentials: bool = True) -> Iterator[Any]:
    context = browser.new_context(
        http_credentials={"username": USER, "password": PASSWORD} if credentials else None,
        viewport={"width": 1400, "height": 900},
    )
    try:
        yield context.new_page()
    finally:
        context.close()


def anonymous_status(browser: Any, url: str) -> int:
    """The status a browser with no credentials gets for ``url`` (it shows no page then)."""
    from playwright.sync_api import Error as PlaywrightError

    with page(browser, credentials=False) as tab:
        statuses: list[int] = []
        tab.on("response", lambda response: statuses.append(response.status))
        with pytest.raises(PlaywrightError, match="ERR_INVALID_AUTH_CREDENTIALS"):
            tab.goto(url)
        assert len(statuses) == 1, statuses
        return statuses[0]


# What each cell shows (innerText: hidden spans left out). A worker's name is two spans laid
# out as blocks, which innerText separates with a line break: joined again.
ROWS_JS = """
rows => rows.map(row => Array.from(row.cells).map(
    cell => cell.innerText.replace(/\\n/g, '').trim()
))
"""


def dashboard_status(tab: Any) -> dict[str, str]:
    """Worker -> the status badge's text, as the rendered workers table shows it."""
    rows = tab.eval_on_selector_all("#workers-table tbody tr", ROWS_JS)
    return {cells[0]: cells[1] for cells in rows if len(cells) > 1}


def wait_dashboard(tab: Any, expected: dict[str, str], timeout_s: float = 30) -> dict[str, str]:
    """Poll the rendered table (it reloads itself every second) until it shows ``expected``."""
    return wait_for(
        lambda: (
            (shown := dashboard_status(tab))
            and all(shown.get(name) == status for name, status in expected.items())
            and shown
        ),
        timeout_s=timeout_s,
        interval_s=0.2,
        message=lambda: f"the dashboard to show {expected}, it shows {dashboard_status(tab)}",
    )


def task_rows(tab: Any) -> list[dict[str, str]]:
    """The rendered tasks table as column -> text (the columns Flower was configured with)."""
    columns = tab.eval_on_selector_all(
        "#tasks-table thead th", "ths => ths.map(th => th.dataset.column || '')"
    )
    rows = tab.eval_on_selector_all("#tasks-table tbody tr", ROWS_JS)
    return [dict(zip(columns, cells, strict=False)) for cells in rows if len(cells) > 1]


def wait_task_row(tab: Any, task_id: str, timeout_s: float = 30) -> dict[str, str]:
    def row() -> dict[str, str] | None:
        return next((r for r in task_rows(tab) if r.get("uuid") == task_id), None)

    return wait_for(
        row,
        timeout_s=timeout_s,
        interval_s=0.3,
        message=lambda: f"task {task_id} on the tasks page, it shows {task_rows(tab)}",
    )


# --------------------------------------------------------------------------- the tests


def heartbeat_window(flower: FlowerProcess, hostname: str) -> float:
    """The offline window Flower gives ``hostname``: its last heartbeat plus freq x 200 %
    (``celery.events.state``), with freq from the worker's own heartbeats, not from the
    one Flower asks for when it starts (that one says 5 s)."""
    row = wait_for(
        lambda: (r := workers_json(flower).get(hostname, {})).get("worker-heartbeat", 0) >= 2 and r,
        timeout_s=30,
        message=lambda: f"heartbeats of {hostname} in {workers_json(flower)}",
    )
    return float(row["freq"]) * HEARTBEAT_EXPIRE_WINDOW / 100


def wait_task_events(*watched: WorkerProcess, timeout_s: float = 30) -> None:
    """Wait until each worker sends task events: with JOBS_TASK_EVENTS=auto (the default)
    it starts without them and switches them on at Flower's first ``enable_events``
    broadcast, about 5 s after Flower starts. A task run before that is not in Flower."""
    for w in watched:
        wait_for(
            partial(_events_on, w),
            timeout_s=timeout_s,
            message=partial(_events_on_message, w),
        )


def _events_on(w: WorkerProcess) -> bool:
    return "task events on" in w.log()


def _events_on_message(w: WorkerProcess) -> str:
    return f"task events on in {w.hostname}:\n{w.log()[-2000:]}"


def wait_listening(flower: FlowerProcess, watched: WorkerProcess) -> None:
    """Flower answers HTTP before its event receiver is connected; a task sent in between
    would reach it only partly (the events it missed are not replayed). A heartbeat seen
    in /metrics shows the receiver is listening."""
    online = f'flower_worker_online{{worker="{watched.hostname}"}} 1.0'
    wait_for(
        lambda: online in get(f"{flower.url}/metrics")[1],
        timeout_s=30,
        message="Flower receiving the worker's events",
    )


def test_browser_sees_busy_and_idle_workers_online_and_a_finished_task_across_a_restart(
    flower_env: dict[str, str],
    flower_tasks: Any,
    redis_release: redis.Redis,
    browser: Any,
    tmp_path: Path,
) -> None:
    busy = worker(flower_env, ["fast", "heavy"], tmp_path)
    idle = worker(flower_env, ["thirdparty"], tmp_path)
    hold_key = uuid.uuid4().hex
    customer = f"acme-{uuid.uuid4().hex[:8]}"
    with workers(busy, idle), FlowerProcess(flower_env, tmp_path) as flower:
        idle_since = time.time()  # ready by then, and it never gets a task
        # The pages and the API need the password...
        assert anonymous_status(browser, flower.url + "/") == 401
        assert get(f"{flower.url}/api/workers")[0] == 401
        # ...but /metrics and /healthcheck do not (Flower's design: docs/deploy.md binds
        # Flower to 127.0.0.1 for that reason).
        assert get(f"{flower.url}/healthcheck") == (200, "OK")
        assert get(f"{flower.url}/metrics")[0] == 200

        # A finished task with distinctive arguments, then one that keeps `busy` busy,
        # once Flower listens and has switched the workers' task events on.
        wait_listening(flower, busy)
        wait_task_events(busy)
        done = flower_tasks.invoice.delay(customer, 4200, currency="SEK")
        assert done.get(timeout=30) == f"invoiced {customer} 4200 SEK"
        held = flower_tasks.hold.delay(hold_key)
        wait_state(held, {"STARTED"})
        try:
            window = heartbeat_window(flower, idle.hostname)
            wait_for(lambda: time.time() - idle_since > 2 * window, timeout_s=4 * window + 5)
            both_online = {busy.hostname: "Online", idle.hostname: "Online"}
            with page(browser) as tab:
                assert tab.goto(flower.url + "/").status == 200
                assert set(wait_dashboard(tab, both_online)) == set(both_online)
                screenshot = tmp_path / "flower-dashboard.png"
                tab.screenshot(path=str(screenshot), full_page=True)
                print(f"dashboard screenshot: {screenshot}")
                assert workers_json(flower)[busy.hostname]["active"] == 1

                # The control: freeze the idle worker (no heartbeats) and the page shows it
                # offline once its window has passed, online again when it resumes. So what
                # kept it online above was its heartbeats.
                idle.signal(signal.SIGSTOP, group=True)
                try:
                    wait_dashboard(tab, {idle.hostname: "Offline"}, timeout_s=window + 10)
                finally:
                    idle.signal(signal.SIGCONT, group=True)
                wait_dashboard(tab, both_online)

                assert tab.goto(flower.url + "/tasks").status == 200
                row = wait_task_row(tab, done.id)
                tab.screenshot(path=str(tmp_path / "flower-tasks.png"), full_page=True)
            assert row["name"] == "flower.invoice"
            assert row["state"] == "SUCCESS"
            assert row["args"] == f"('{customer}', 4200)"
            assert row["kwargs"] == "{'currency': 'SEK'}"
            assert row["worker"] == busy.hostname
            online = f'flower_worker_online{{worker="{idle.hostname}"}} 1.0'
            assert online in get(f"{flower.url}/metrics")[1]
            assert PASSWORD not in flower.log()

            # Restart on the same state file (SIGTERM, as `docker stop`: Flower saves it on
            # the way out; the periodic save, every 60 s by default, has not run yet).
            assert flower.stop() == 0, flower.log()[-3000:]
            again = FlowerProcess(flower_env, tmp_path, name="flower-restarted")
            with again, page(browser) as tab:
                tab.goto(again.url + "/tasks")
                row = wait_task_row(tab, done.id)
                assert (row["state"], row["args"]) == ("SUCCESS", f"('{customer}', 4200)")
                tab.goto(again.url + "/")
                wait_dashboard(tab, both_online)
                tab.screenshot(path=str(tmp_path / "flower-dashboard-restarted.png"))
        finally:
            flower_tasks.release(hold_key, redis_release)
        assert held.get(timeout=30) == "released"


def test_flower_keeps_its_state_through_a_crash_when_it_saves_periodically(
    flower_env: dict[str, str], flower_tasks: Any, tmp_path: Path
) -> None:
    env = {**flower_env, "JOBS_FLOWER_STATE_SAVE_INTERVAL": "1"}
    state_files = lambda: list(tmp_path.glob("flower.db*"))  # noqa: E731 (dbm adds suffixes)
    with worker(env, ["fast"], tmp_path) as busy, FlowerProcess(env, tmp_path) as flower:
        wait_listening(flower, busy)
        wait_task_events(busy)
        done = flower_tasks.invoice.delay("crash-test", 1)
        assert done.get(timeout=30).startswith("invoiced")
        info = f"{flower.url}/api/task/info/{done.id}"

        def finished_in_flower() -> bool:
            status, body = get(info, auth=(USER, PASSWORD))
            return status == 200 and (json.loads(body)["state"], json.loads(body)["args"]) == (
                "SUCCESS",
                "('crash-test', 1)",
            )

        wait_for(finished_in_flower, timeout_s=30, message=f"{done.id} finished in Flower")

        def last_save() -> float:
            # A save writes then renames a .tmp file: it may vanish between glob and stat.
            stamps = []
            for f in state_files():
                if ".tmp" not in f.name:
                    with contextlib.suppress(FileNotFoundError):
                        stamps.append(f.stat().st_mtime)
            return max(stamps, default=0.0)

        seen = time.time()
        # A save that started after Flower had the task, and the next one started (so the
        # first finished: a kill inside a save is not what this test is about).
        first = wait_for(
            lambda: saved if (saved := last_save()) > seen else None,
            timeout_s=10,
            message=lambda: f"a state save after {seen} ({state_files()})",
        )
        wait_for(lambda: last_save() > first, timeout_s=10, message="the next state save")
        flower.kill()
        with FlowerProcess(env, tmp_path, name="flower-after-crash") as again:
            status, body = get(f"{again.url}/api/task/info/{done.id}", auth=(USER, PASSWORD))
    assert status == 200, body
    assert (json.loads(body)["state"], json.loads(body)["args"]) == ("SUCCESS", "('crash-test', 1)")


def refused(env: dict[str, str], tmp: Path) -> str:
    """Start Flower, which must refuse: its output (the port was never bound)."""
    flower = FlowerProcess(env, tmp).start(wait=False)
    try:
        code = flower.wait_exit(60)
    finally:
        flower.kill()
    assert code != 0, flower.log()[-3000:]
    assert "Visit me at" not in flower.log()
    assert get(f"{flower.url}/healthcheck")[0] == 0
    return flower.log()


def test_flower_refuses_to_start_without_authentication(
    flower_env: dict[str, str], tmp_path: Path
) -> None:
    env = {k: v for k, v in flower_env.items() if k != "JOBS_FLOWER_BASIC_AUTH"}
    output = refused(env, tmp_path)
    assert "Error: Flower refuses to start without authentication" in output
    assert "JOBS_FLOWER_BASIC_AUTH=user:password" in output
    assert "Traceback" not in output


@pytest.mark.parametrize(
    ("value", "shown"),
    [("ops", "entry 1 ((no colon))"), (f"ops:{PASSWORD},admin:", "entry 2 (admin)")],
)
def test_flower_refuses_a_malformed_basic_auth_without_echoing_the_password(
    flower_env: dict[str, str], tmp_path: Path, value: str, shown: str
) -> None:
    output = refused({**flower_env, "JOBS_FLOWER_BASIC_AUTH": value}, tmp_path)
    assert f"Flower basic-auth entry {shown.split(' ', 2)[1]} {shown.split(' ', 2)[2]}" in output
    assert PASSWORD not in output


def test_flower_refuses_a_state_file_it_could_not_write(
    flower_env: dict[str, str], tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-dir" / "flower.db"
    output = refused({**flower_env, "JOBS_FLOWER_DB": str(missing)}, tmp_path)
    assert f"directory {missing.parent} does not exist" in output


def test_flowers_own_variables_win_and_passwords_stay_out_of_the_log(
    flower_env: dict[str, str], tmp_path: Path
) -> None:
    theirs = f"flower-pw-{uuid.uuid4().hex[:8]}"
    env = {**flower_env, "FLOWER_BASIC_AUTH": f"admin:{theirs}"}
    with FlowerProcess(env, tmp_path) as flower:
        api = f"{flower.url}/api/workers?status=true"
        assert get(api, auth=("admin", theirs))[0] == 200
        assert get(api, auth=(USER, PASSWORD))[0] == 401
        assert get(api)[0] == 401
    log = flower.log()
    assert "Flower: basic auth for admin (password hidden)" in log
    assert theirs not in log and PASSWORD not in log


def test_flower_starts_open_only_when_told_to_and_says_so(
    flower_env: dict[str, str], tmp_path: Path
) -> None:
    env = {k: v for k, v in flower_env.items() if k != "JOBS_FLOWER_BASIC_AUTH"}
    env["JOBS_FLOWER_UNSAFE_NO_AUTH"] = "1"
    with FlowerProcess(env, tmp_path) as flower:
        assert get(f"{flower.url}/workers")[0] == 200
    assert "Flower: NO AUTHENTICATION (JOBS_FLOWER_UNSAFE_NO_AUTH)" in flower.log()


# --------------------------------------------------------------------------- without heartbeats


@contextlib.contextmanager
def old_and_new_workers(
    env: dict[str, str], tmp: Path, *, flower_first: bool = False
) -> Iterator[tuple[WorkerProcess, WorkerProcess, FlowerProcess]]:
    """A worker as the profiles started it before (``--without-heartbeat``), one as now,
    and Flower, started after them (as after a Flower restart) or before them."""
    old = worker(env, ["fast"], tmp, "--without-heartbeat")
    new = worker(env, ["thirdparty"], tmp)
    flower = FlowerProcess(env, tmp)
    with contextlib.ExitStack() as stack:
        if flower_first:
            stack.enter_context(flower)
        stack.enter_context(workers(old, new))
        if not flower_first:
            stack.enter_context(flower)
        yield old, new, flower


def test_without_heartbeats_flower_shows_an_idle_live_worker_offline_short_form(
    flower_env: dict[str, str], flower_tasks: Any, tmp_path: Path
) -> None:
    """The issue's failure in seconds. Celery's ``heartbeat`` control command asks a worker
    for one heartbeat, which says freq 5 s (Flower sends it when it starts, but on Redis the
    reply can arrive before Flower listens, and the worker is then not listed at all). A
    worker without heartbeats of its own then shows online for 2 x 5 s, and offline after
    that although it is alive. After a task, task events keep it online for 2 x its freq
    (the long form waits out the 120 s case)."""
    with old_and_new_workers(flower_env, tmp_path) as (old, new, flower):
        # Flower listens once it shows the worker with heartbeats.
        wait_for(lambda: online_status(flower).get(new.hostname), timeout_s=30)
        flower_tasks.app.control.heartbeat(destination=[old.hostname])
        wait_for(
            lambda: online_status(flower).get(old.hostname),
            timeout_s=10,
            message=lambda: f"{old.hostname} online: {workers_json(flower)}",
        )
        assert workers_json(flower)[old.hostname]["freq"] == 5
        wait_for(
            lambda: online_status(flower)[old.hostname] is False,
            timeout_s=2 * 5 + 10,
            message="the worker without heartbeats to show offline",
        )
        # It is alive and answers; the worker with heartbeats is online all along.
        replies = flower_tasks.app.control.ping([old.hostname, new.hostname], timeout=5)
        assert {name for reply in replies for name in reply} == {old.hostname, new.hostname}
        assert online_status(flower)[new.hostname] is True

        wait_task_events(old)  # switched on by Flower although it sends no heartbeats
        assert flower_tasks.invoice.delay("wakes-it", 1).get(timeout=30).startswith("invoiced")
        wait_for(lambda: online_status(flower).get(old.hostname), timeout_s=30)
        # Task events set no freq: it keeps the 5 s of that one heartbeat, so it shows online
        # for 10 s after each task (120 s, with celery.events.state's default of 60 s, when
        # Flower first hears of it through a task). Heartbeats carry the worker's interval.
        freqs = {name: row["freq"] for name, row in workers_json(flower).items()}
        assert freqs == {old.hostname: 5, new.hostname: 2.0}


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.skipif(
    os.environ.get("JOBS_LONG_TESTS") != "1", reason="long form (~2.5 min): JOBS_LONG_TESTS=1"
)
def test_without_heartbeats_an_idle_worker_goes_offline_while_alive_long_form(
    flower_env: dict[str, str], flower_tasks: Any, tmp_path: Path
) -> None:
    # Flower runs first, so it hears of the worker without heartbeats through its task only.
    with old_and_new_workers(flower_env, tmp_path, flower_first=True) as (old, new, flower):
        wait_task_events(old)
        assert flower_tasks.invoice.delay("last-task", 1).get(timeout=30).startswith("invoiced")
        last_task = time.monotonic()
        wait_for(lambda: online_status(flower).get(old.hostname), timeout_s=30)
        assert workers_json(flower)[old.hostname]["freq"] == 60
        wait_for(
            lambda: online_status(flower)[old.hostname] is False,
            timeout_s=200,
            interval_s=1,
            message="Flower to show the worker without heartbeats offline",
        )
        offline_after = time.monotonic() - last_task
        assert 110 < offline_after < 140, offline_after
        replies = flower_tasks.app.control.ping([old.hostname], timeout=5)
        assert replies and old.alive  # it was alive all along
        assert online_status(flower)[new.hostname] is True
        print(f"without heartbeats: offline in Flower {offline_after:.0f} s after its last task")
