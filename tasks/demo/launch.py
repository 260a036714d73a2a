"""``python -m tasks.demo [--short] [--broker redis|rabbitmq] [--keep-vhost] [--dir DIR]
[--seed N]``: start, tour, stop, report.

The broker (:mod:`.broker`): Redis (the default) or RabbitMQ (``--broker rabbitmq`` or
``JOBS_DEMO_BROKER=rabbitmq``: a vhost of the tour's own, deleted at the end unless
``--keep-vhost``). The tour's Redis (the broker, or RabbitMQ's coordination Redis): an empty
database claimed on the Redis at ``JOBS_BROKER_URL`` (``JOBS_COORDINATION_URL`` on RabbitMQ)
and flushed at the end, or a private ``redis-server`` stopped at the end. The tour runs in a
child process pointed at it (the ``tasks`` app reads its settings when it is imported,
which ``python -m tasks.demo`` has already done).

The database is the platform's default SQLite file (``./jobs_platform.sqlite3``) unless
``JOBS_DATABASE_URL`` says otherwise; files (uploads, thumbnails, logs, Flower's state, the
chart) go under ``--dir`` / ``JOBS_DEMO_DIR`` (default ``.demo`` in the repository).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from rich.console import Console

from jobs_platform import db
from jobs_platform.errors import ConfigError
from jobs_platform.urls import masked
from tasks import billing, shop
from tasks.demo import broker, chart, report, stack, tour
from tasks.demo.live import LiveView
from tasks.demo.observe import EventLog, Sampler
from tasks.jobs import app
from tasks.paths import absolute_database_url

STOCK_SYNC_EVERY_S = 1.0


@dataclasses.dataclass(frozen=True)
class Options:
    short: bool
    demo_dir: Path
    seed: int
    broker: str = "redis"
    keep_vhost: bool = False


def parse_args(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m tasks.demo",
        description="The reference app as a shop, end to end on real services, with a report.",
    )
    parser.add_argument(
        "--short",
        action="store_true",
        default=os.environ.get("JOBS_DEMO_SHORT", "") not in ("", "0"),
        help="the same steps with a smaller workload (JOBS_DEMO_SHORT=1)",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path(os.environ.get("JOBS_DEMO_DIR") or stack.ROOT / ".demo"),
        help="where the tour writes its files (JOBS_DEMO_DIR; default .demo in the repository)",
    )
    parser.add_argument("--seed", type=int, default=7, help="the flaky gateway's seed")
    parser.add_argument(
        "--broker",
        choices=broker.KINDS,
        default=None,
        help=f"redis (the default) or rabbitmq ({broker.KIND_ENV})",
    )
    parser.add_argument(
        "--keep-vhost",
        action="store_true",
        help="on RabbitMQ, keep the tour's vhost at the end (to look at its queues)",
    )
    args = parser.parse_args(argv)
    kind = args.broker or broker.kind_of(os.environ.get(broker.KIND_ENV, ""))
    return Options(
        short=args.short,
        demo_dir=args.dir.resolve(),
        seed=args.seed,
        broker=kind,
        keep_vhost=args.keep_vhost,
    )


def console_for_output() -> Console:
    # Wide enough for the report's tables even when output is piped (make, CI logs).
    return Console(highlight=False, width=max(Console().width, 140))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    console = console_for_output()
    try:
        options = parse_args(args)
    except ConfigError as exc:
        console.print(f"[bold red]{exc}[/]")
        return 2
    chosen = broker.from_env(os.environ)
    if chosen is not None:  # the child: the launching process chose its broker
        return run_tour(options, chosen, console)
    try:
        with broker.choose(
            os.environ, kind=options.broker, keep_vhost=options.keep_vhost
        ) as chosen:
            console.print(f"broker: [bold]{chosen.describe()}[/]; {chosen.fate()}")
            return run_child(args, chosen)
    except ConfigError as exc:
        console.print(f"[bold red]{exc}[/]")
        return 1


def run_child(args: list[str], chosen: broker.Broker) -> int:
    """The tour in a child process on ``chosen``; its exit status."""
    env = {
        **os.environ,
        "JOBS_BROKER_URL": chosen.broker_url,
        # Everything in that one Redis database: results and coordination too (their own
        # settings from the shell would put the tour's keys elsewhere). On RabbitMQ the
        # coordination Redis is required, and results default to it.
        "JOBS_RESULT_BACKEND": "",
        "JOBS_COORDINATION_URL": chosen.url if chosen.rabbitmq else "",
        **chosen.to_env(),
    }
    child = subprocess.Popen([sys.executable, "-m", "tasks.demo", *args], env=env)
    # `kill` of this process stops the tour as Ctrl-C does; then the broker is put back.
    signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signal.SIGTERM))
    while True:
        try:
            return child.wait()
        except KeyboardInterrupt:
            continue  # the child got the same Ctrl-C and is stopping what it started


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run_tour(options: Options, chosen: broker.Broker, console: Console) -> int:
    """Start everything, run the tour, stop everything (even on Ctrl-C), report."""
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops it as cleanly as Ctrl-C
    broker_url = chosen.broker_url
    workload = tour.SHORT if options.short else tour.FULL
    demo_dir = options.demo_dir
    demo_dir.mkdir(parents=True, exist_ok=True)
    database_url = absolute_database_url(app.jobs_settings.database_url)
    # Read by the app's code at call time in this process (billing, paths).
    os.environ["JOBS_DATABASE_URL"] = database_url
    os.environ["JOBS_APP_DATA"] = str(demo_dir / "appdata")
    # The tour's event log starts from task-sent events, which a producer sends only with
    # JOBS_TASK_EVENTS=on (it cannot know a monitor listens); its processes get "on" too.
    app.conf.task_send_sent_event = True
    began = time.time()
    console.print(f"database: [bold]{masked(database_url)}[/]; files under [bold]{demo_dir}[/]")
    db.upgrade(database_url)  # once, before the workers (they would race on SQLite)
    shop.create_schema(billing.billing_engine())
    shop.sync_runs_log().unlink(missing_ok=True)
    tour.make_uploads(workload.uploads)
    try:
        with contextlib.ExitStack() as stack:
            services = stack_start(stack, options, broker_url, database_url, console)
            ready = time.time()
            sampler = stack.enter_context(Sampler(services.metrics_url))
            events = stack.enter_context(EventLog(app))
            facts = tour.Facts(
                workload, time.time(), broker_url, database_url, demo_dir, services, broker=chosen
            )
            stack.callback(tour.forget_delayed, facts)
            view = stack.enter_context(LiveView(console, sampler, events, facts.t0))
            console.print(
                f"Flower: [bold]{services.flower_url}[/] (user {services.flower_auth[0]}, "
                f"password {services.flower_auth[1]})   metrics: [bold]{services.metrics_url}[/]"
            )
            tour.run(facts, view, events, sampler)
            tour.gather(facts, events, sampler)
            stopping = time.time()
            view.say("stopping every process the tour started ...")
    except KeyboardInterrupt:
        console.print("[bold]interrupted:[/] everything the tour started has been stopped")
        return 130
    except Exception:
        console.print_exception(max_frames=8)
        console.print(
            "[bold red]the tour failed[/] (above); everything it started has been stopped. "
            f"The processes' logs are in {demo_dir / 'logs'}"
        )
        return 1
    stopped = time.time()
    path = chart.draw(facts, demo_dir / "tour.png")
    ok = report.print_report(console, facts, str(path))
    console.print(
        f"\nthe tour took {stopped - began:.0f} s: start-up {ready - began:.0f} s, workload "
        f"{stopping - facts.t0:.0f} s, stopping {stopped - stopping:.0f} s"
    )
    console.print(f"chart: [bold]{path}[/]")
    if not ok:
        console.print("[bold red]some expectations did not hold (above)[/]")
        return 1
    console.print("[bold green]every expectation held[/]")
    return 0


def stack_start(
    stack_: contextlib.ExitStack,
    options: Options,
    broker_url: str,
    database_url: str,
    console: Console,
) -> stack.Stack:
    return stack.start(
        stack_,
        broker_url=broker_url,
        database_url=database_url,
        demo_dir=options.demo_dir,
        seed=options.seed,
        stock_sync_every_s=STOCK_SYNC_EVERY_S,
        say=console.print,
    )
