"""The container recipe (docker-compose.yml, Dockerfile, .env.example, .dockerignore).

No Docker engine runs here, so the files are checked for what they promise, and every
``celery`` command compose runs (services and health checks) is run for real against this
project's CLI, in its service's environment, without starting anything: once with
``--help`` (``--print`` for a worker, which shows the real ``celery worker`` argv), and once
with the subcommand's action replaced (:data:`PARSE_ONLY`), which parses and checks every
option and value as the container would.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from jobs_platform.profiles import PROFILES
from jobs_platform.routing import QUEUE_NAMES

ROOT = Path(__file__).resolve().parents[2]
CELERY = str(Path(sys.executable).parent / "celery")
#: Stand-ins for the values .env.example leaves empty (compose refuses to start without them).
SECRETS = {
    "POSTGRES_PASSWORD": "pg-secret",
    "FLOWER_PASSWORD": "flower-secret",
    "GRAFANA_PASSWORD": "grafana-secret",
}
#: The one service without a health check: a one-shot job that exits. Its exit status is
#: its health (the workers wait for `service_completed_successfully`), and a health check
#: on a container that is meant to stop would only report it unhealthy once it is done.
ONE_SHOT = "migrate"
#: What a worker container checks (docs/health.md): its own queue, not beat or the backlog.
WORKER_CHECKS = ("broker", "consumers", "canary")
#: Start-up of Python and Celery on top of `health --timeout` (measured 1.5-2 s here).
HEALTH_STARTUP_S = 2.0

# $$ is a literal $; otherwise ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error}...
COMPOSE_VAR = re.compile(r"\$\$|\$\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")

#: ``celery ARGV`` run for real up to its subcommand's action, which is replaced: the app
#: loads from -A, every option and value is parsed and checked as in the container, and
#: nothing starts. Prints what was parsed as JSON; for flower also Flower's effective
#: options, once its environment and command line are applied as Flower applies them
#: (it silently drops a flag that is not one of its options, so that is refused here).
PARSE_ONLY = r"""
import json, sys
import click
from celery.bin.celery import celery

argv = sys.argv[1:]
command, words = celery, argv[2:]
while isinstance(command, click.Group) and words and words[0] in command.commands:
    command = command.commands[words.pop(0)]
if command is celery:
    sys.exit(f"no celery subcommand in {argv}")


def parsed(**params):
    app = click.get_current_context().obj.app
    report = {"params": params, "beat_scheduler": str(app.conf.beat_scheduler)}
    if command.name == "flower":
        from flower.command import apply_env_options, apply_options, is_flower_option
        from tornado.options import options

        unknown = [arg for arg in params["tornado_argv"] if not is_flower_option(arg)]
        if unknown:
            raise click.UsageError(f"not Flower options: {unknown}")
        apply_env_options()
        apply_options("flower", list(params["tornado_argv"]))
        names = ("port", "address", "basic_auth", "persistent", "db")
        report["flower"] = {name: options[name] for name in names}
    print(json.dumps(report, default=str))


command.callback = parsed
celery.main(args=argv, prog_name="celery", auto_envvar_prefix="CELERY")
"""


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(loaded, dict)
    return loaded


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = compose["services"]
    return services


def env_example() -> dict[str, str]:
    pairs = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, sep, value = line.partition("=")
            assert sep, f".env.example: not NAME=value: {line!r}"
            pairs[name.strip()] = value.strip()
    return pairs


class ComposeRefuses(Exception):
    """A required variable (``${NAME:?message}``) is unset or empty."""


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's variable substitution, for the forms docker-compose.yml uses."""

    def substitute(match: re.Match[str]) -> str:
        name, op, arg = match["name"], match["op"], match["arg"]
        if name is None:
            return "$"
        value = env.get(name)
        if op is not None and "?" in op and not (value or (op == "?" and value is not None)):
            raise ComposeRefuses(arg)
        if op == ":-" and not value:
            return str(arg)
        if op == "-" and value is None:
            return str(arg)
        return value or ""

    return COMPOSE_VAR.sub(substitute, text)


def compose_env() -> dict[str, str]:
    """What a team's .env holds after filling in .env.example."""
    env = env_example()
    return {**env, **{name: value for name, value in SECRETS.items() if not env.get(name)}}


def container_env(service: dict[str, Any]) -> dict[str, str]:
    environment = service.get("environment") or {}
    assert isinstance(environment, dict), "environment as a mapping"
    return {name: interpolate(str(value), compose_env()) for name, value in environment.items()}


def service_argv(service: dict[str, Any]) -> list[str]:
    command = service["command"]
    assert isinstance(command, list), "commands in exec form, so signals reach the process"
    return [interpolate(str(part), compose_env()) for part in command]


def healthcheck_argv(service: dict[str, Any]) -> list[str]:
    kind, *rest = service["healthcheck"]["test"]
    if kind == "CMD":
        return [interpolate(str(part), compose_env()) for part in rest]
    assert kind == "CMD-SHELL" and len(rest) == 1, service["healthcheck"]
    # The container's shell expands $NAME from the service's environment.
    line = interpolate(str(rest[0]), compose_env())
    expanded = re.sub(r"\$(\w+)", lambda m: container_env(service)[m[1]], line)
    return shlex.split(expanded)


def seconds(duration: str | int) -> float:
    """A compose duration (``15s``, ``1m30s``, ``500ms``) in seconds."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", str(duration))
    assert parts and "".join(n + u for n, u in parts) == str(duration), duration
    unit = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(float(number) * unit[name] for number, name in parts)


def probe_url(service: dict[str, Any]) -> str:
    """The URL a ``python -c`` or ``wget`` health check fetches (checked to compile)."""
    argv = healthcheck_argv(service)
    if argv[:2] == ["python", "-c"]:
        compile(argv[2], f"{service['command']} healthcheck", "exec")
        urls = re.findall(r"'(http://[^']+)'", argv[2])
    else:
        urls = [part for part in argv if part.startswith("http://")]
    assert len(urls) == 1, argv
    return str(urls[0])


def published(service: dict[str, Any]) -> list[tuple[str, str, int]]:
    """(host address, host port, container port) of each published port."""
    ports = []
    for spec in service.get("ports", []):
        host, host_port, container_port = interpolate(str(spec), compose_env()).split(":")
        ports.append((host, host_port, int(container_port)))
    return ports


def bind_mounts(service: dict[str, Any]) -> list[tuple[Path, str, str]]:
    """(repository path, container path, mode) of each bind mount (a ./ or / source)."""
    mounts = []
    for spec in service.get("volumes", []):
        source, target, *mode = str(spec).split(":")
        if source.startswith((".", "/")):
            mounts.append((ROOT / source, target, mode[0] if mode else "rw"))
    return mounts


def in_container(service: dict[str, Any], path: str) -> Path:
    """The repository file a bind mount puts at ``path`` in the container."""
    for source, target, _ in bind_mounts(service):
        if PurePosixPath(path).is_relative_to(target):
            return source / PurePosixPath(path).relative_to(target)
    raise AssertionError(f"nothing mounted at {path}")


def clean_env(env: dict[str, str]) -> dict[str, str]:
    # The host's own JOBS_*/FLOWER_* settings must not leak in: the service's env only.
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JOBS_", "FLOWER_"))}
    return {**base, **env}


def run_celery(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    assert argv[0] == "celery", argv
    return subprocess.run(
        [CELERY, *argv[1:]],
        env=clean_env(env),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def parse_only(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    assert argv[0] == "celery", argv
    command = [sys.executable, "-c", PARSE_ONLY, *argv[1:]]
    return subprocess.run(
        command, env=clean_env(env), cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    instructions = [line.split(None, 1) for line in lines if line and not line.startswith("#")]
    return [(parts[0].upper(), parts[1] if len(parts) > 1 else "") for parts in instructions]


def worker_names() -> list[str]:
    return [f"worker-{queue}" for queue in QUEUE_NAMES]


def celery_commands(services: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """Every celery argv compose runs (commands, health checks), keyed by service/kind."""
    found = {}
    for name, service in services.items():
        if "command" in service and service_argv(service)[0] == "celery":
            found[f"{name} command"] = service_argv(service)
        if service.get("healthcheck") and healthcheck_argv(service)[0] == "celery":
            found[f"{name} healthcheck"] = healthcheck_argv(service)
    return found


def service_of(key: str) -> str:
    return key.split()[0]


Runs = dict[str, tuple[list[str], subprocess.CompletedProcess[str]]]


@pytest.fixture(scope="module")
def helped(services: dict[str, dict[str, Any]]) -> Runs:
    """Each command with ``--help`` (a worker's with ``--print``), in its service's env;
    once per distinct shape (the workers' health checks differ only in the queue)."""
    runs: dict[str, tuple[list[str], dict[str, str]]] = {}
    shapes = set()
    for key, argv in celery_commands(services).items():
        env = container_env(services[service_of(key)])
        if argv[3] == "worker-profile":
            runs[key] = ([*argv, "--print"], env)
            continue
        shape = tuple(part if part not in QUEUE_NAMES else "QUEUE" for part in argv)
        if shape not in shapes:
            shapes.add(shape)
            runs[key] = ([*argv, "--help"], env)
    return run_all(runs, run_celery)


@pytest.fixture(scope="module")
def parsed(services: dict[str, dict[str, Any]]) -> Runs:
    """Each distinct command through :data:`PARSE_ONLY`, in its service's environment; not
    the workers' (``--print`` above runs their real command, which parses every value)."""
    runs: dict[str, tuple[list[str], dict[str, str]]] = {}
    seen = set()
    for key, argv in celery_commands(services).items():
        if argv[3] == "worker-profile":
            continue
        env = container_env(services[service_of(key)])
        identity = (tuple(argv), tuple(sorted(env.items())))
        if identity not in seen:  # beat-standby runs exactly what beat runs
            seen.add(identity)
            runs[key] = (argv, env)
    return run_all(runs, parse_only)


def run_all(runs: dict[str, tuple[list[str], dict[str, str]]], runner: Any) -> Runs:
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda run: runner(*run), runs.values()))
    return {key: (run[0], result) for (key, run), result in zip(runs.items(), results, strict=True)}


def report(parsed: Runs, key: str) -> dict[str, Any]:
    argv, result = parsed[key]
    assert result.returncode == 0, f"{shlex.join(argv)}: {result.stdout}{result.stderr}"
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert isinstance(loaded, dict)
    return loaded


def test_compose_runs_the_whole_stack(services: dict[str, dict[str, Any]]) -> None:
    expected = {"redis", "postgres", "migrate", "beat", "beat-standby", "flower", "metrics"}
    assert {*expected, "prometheus", "grafana", *worker_names()} <= set(services)
    for name, service in services.items():
        assert ("image" in service) != ("build" in service), f"{name}: an image or our build"
        if "build" not in service:
            assert ":" in service["image"], f"{name}: pin the image's version"


def test_every_queue_has_a_worker_with_its_profile(
    services: dict[str, dict[str, Any]], helped: Runs
) -> None:
    assert set(PROFILES) == set(QUEUE_NAMES)
    workers = {
        name: argv
        for name, service in services.items()
        if "command" in service and (argv := service_argv(service))[3:4] == ["worker-profile"]
    }
    assert sorted(workers) == sorted(worker_names()), "one worker service per queue"
    for queue in QUEUE_NAMES:
        worker = services[f"worker-{queue}"]
        assert worker["command"][:5] == [
            "celery",
            "-A",
            "${JOBS_APP:-tasks}",
            "worker-profile",
            queue,
        ]
        assert container_env(worker)["JOBS_BROKER_URL"].startswith("redis://")
        # The real `celery worker` argv the profile expands to consumes exactly that queue.
        argv, printed = helped[f"worker-{queue} command"]
        assert printed.returncode == 0, f"{shlex.join(argv)}: {printed.stderr}"
        real = shlex.split(printed.stdout)
        assert real[3] == "worker" and real[real.index("-Q") + 1] == queue
    # Deploys wait for running tasks at least as long as the queue's hard time limit.
    heavy_grace = seconds(services["worker-heavy"]["stop_grace_period"])
    assert heavy_grace > PROFILES["heavy"].time_limit_s


def test_every_service_has_a_healthcheck_but_the_one_shot_migration(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, service in services.items():
        if name == ONE_SHOT:
            # Exactly one exception (see ONE_SHOT): it runs once, is never restarted, and
            # its exit status is what the workers wait for.
            assert service["restart"] == "no", "a one-shot job is not restarted"
            assert "healthcheck" not in service
            continue
        test = service.get("healthcheck", {}).get("test")
        assert test and test[0] in {"CMD", "CMD-SHELL"}, f"{name} has no health check"
        assert not service["healthcheck"].get("disable"), name


def test_workers_wait_for_the_one_shot_migration(services: dict[str, dict[str, Any]]) -> None:
    migrate = services[ONE_SHOT]
    assert service_argv(migrate)[3:] == ["db", "upgrade"]
    assert migrate["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    for name in [*worker_names(), "beat", "beat-standby", "metrics"]:
        depends = services[name]["depends_on"]
        assert depends["migrate"] == {"condition": "service_completed_successfully"}, name
        assert depends["redis"] == {"condition": "service_healthy"}, name
        # Migrating once, before any worker, instead of every worker racing at start.
        assert container_env(services[name])["JOBS_AUTO_MIGRATE"] == "false"


def test_every_celery_command_compose_runs_exists(
    services: dict[str, dict[str, Any]], helped: Runs
) -> None:
    commands = celery_commands(services)
    # Workers and their health checks; migrate; two beats and their checks; flower; metrics.
    assert len(commands) == 2 * len(QUEUE_NAMES) + 1 + 4 + 2
    subcommands = {
        " ".join(argv[3:5]) if argv[3] == "db" else argv[3] for argv in commands.values()
    }
    assert subcommands == {"worker-profile", "health", "db upgrade", "beat", "flower", "metrics"}
    for key, (argv, result) in helped.items():
        assert argv[1:3] == ["-A", "tasks"], key
        assert result.returncode == 0, f"{shlex.join(argv)}: {result.stdout}{result.stderr}"
        # No complaint about a variable compose sets (a JOBS_* typo only gets a warning).
        env = container_env(services[service_of(key)])
        assert not [name for name in env if name in result.stderr], result.stderr
        if argv[-1] == "--help":
            path = " ".join(argv[3:5]) if argv[3] == "db" else argv[3]
            assert f"Usage: celery {path}" in result.stdout, key


def test_every_option_and_value_compose_passes_is_accepted(
    services: dict[str, dict[str, Any]], parsed: Runs
) -> None:
    """``--help`` stops before values are checked (``health --queue fats --help`` exits 0),
    and Flower's own flags are not Celery's: both are checked here, action replaced."""
    for key in parsed:
        assert "params" in report(parsed, key), key
    # The check itself catches what --help lets through.
    env = container_env(services["worker-fast"])
    typo = parse_only(["celery", "-A", "tasks", "health", "--queue", "fats"], env)
    assert typo.returncode == 2 and "'fats' is not one of" in typo.stderr, typo.stderr
    flag = parse_only(
        ["celery", "-A", "tasks", "flower", "--prot=5555"], container_env(services["flower"])
    )
    assert flag.returncode == 2 and "not Flower options: ['--prot=5555']" in flag.stderr, (
        flag.stderr
    )


def test_worker_health_checks_check_their_own_queue_in_time(
    services: dict[str, dict[str, Any]], parsed: Runs
) -> None:
    for queue in QUEUE_NAMES:
        name = f"worker-{queue}"
        argv = healthcheck_argv(services[name])
        assert argv[3] == "health"
        params = report(parsed, f"{name} healthcheck")["params"]
        assert params["queues"] == [queue], name
        assert sorted(params["selected"]) == sorted(WORKER_CHECKS), name
        # The run ends at --timeout whatever is broken; Docker's timeout must not cut it.
        check = services[name]["healthcheck"]
        assert seconds(check["timeout"]) >= params["timeout"] + HEALTH_STARTUP_S, name
        assert seconds(check["interval"]) > seconds(check["timeout"]), name


def test_two_beats_run_the_same_plain_command_and_check_beat(
    services: dict[str, dict[str, Any]], parsed: Runs
) -> None:
    from celery import beat
    from celery.utils.imports import symbol_by_name

    beats = [services["beat"], services["beat-standby"]]
    assert service_argv(beats[0]) == service_argv(beats[1]) == ["celery", "-A", "tasks", "beat"]
    assert healthcheck_argv(beats[0]) == healthcheck_argv(beats[1])
    params = report(parsed, "beat healthcheck")["params"]
    assert "beat" in params["selected"] and params["queues"] == []
    check = beats[0]["healthcheck"]
    assert seconds(check["timeout"]) >= params["timeout"] + HEALTH_STARTUP_S
    # No -s: the app's scheduler keeps its state on Redis and opens no shelve file (that
    # is Celery's PersistentScheduler), so a beat writes nothing to its read-only WORKDIR.
    scheduler = symbol_by_name(report(parsed, "beat command")["beat_scheduler"])
    assert issubclass(scheduler, beat.Scheduler)
    assert not issubclass(scheduler, beat.PersistentScheduler)


def test_redis_keeps_an_append_only_file_on_a_volume(services: dict[str, dict[str, Any]]) -> None:
    argv = service_argv(services["redis"])
    assert argv[0] == "redis-server"
    assert argv[argv.index("--appendonly") + 1] == "yes"
    # What docs/operations.md promises ("nothing the broker acknowledged is lost"); it was
    # everysec, which loses the last second of writes.
    assert argv[argv.index("--appendfsync") + 1] == "always"
    assert "appendfsync always" in (ROOT / "docs" / "operations.md").read_text()
    assert "redis-data:/data" in services["redis"]["volumes"]


def test_heavy_concurrency_is_the_cpu_limit_not_the_host_core_count(
    services: dict[str, dict[str, Any]],
) -> None:
    heavy = services["worker-heavy"]
    argv = heavy["command"]
    assert argv[argv.index("-c") + 1] == "${HEAVY_CONCURRENCY:-2}"
    assert heavy["cpus"] == "${HEAVY_CONCURRENCY:-2}", "one process per CPU the container gets"


def test_env_example_names_every_variable_compose_reads() -> None:
    used = {m["name"] for m in COMPOSE_VAR.finditer((ROOT / "docker-compose.yml").read_text())}
    used.discard(None)
    assert used, "compose reads no variables?"
    documented = env_example()
    assert sorted(used - set(documented)) == []
    assert sorted(set(documented) - used) == [], "documented but unused"
    lines = (ROOT / ".env.example").read_text().splitlines()
    for index, line in enumerate(lines):
        if "=" in line and not line.startswith("#"):
            assert index > 0 and lines[index - 1].startswith("#"), f"no comment for {line!r}"


def test_compose_refuses_to_start_without_its_secrets() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    for name in SECRETS:
        uses = [m for m in COMPOSE_VAR.finditer(text) if m["name"] == name]
        assert uses and all(m["op"] == ":?" for m in uses), f"{name} must be required, no default"
        # Copying .env.example unchanged must not start the stack with a known password.
        assert env_example()[name] == ""
        with pytest.raises(ComposeRefuses, match=name):
            interpolate(text, {**compose_env(), name: ""})


def test_flower_needs_a_password_and_keeps_its_state_on_a_volume(
    services: dict[str, dict[str, Any]], parsed: Runs
) -> None:
    from flower.options import default_options

    flower = services["flower"]
    env = container_env(flower)
    # Flower silently ignores a FLOWER_* name that is not one of its options.
    for name in env:
        if name.startswith("FLOWER_"):
            assert name.removeprefix("FLOWER_").lower() in default_options, name
    assert not any("auth" in part for part in flower["command"]), "password kept out of argv"
    # What Flower really ends up with, through the platform's defaults and its own env.
    options = report(parsed, "flower command")["flower"]
    assert options["basic_auth"] == [f"admin:{SECRETS['FLOWER_PASSWORD']}"]
    assert options["persistent"] is True
    state_dir = str(PurePosixPath(options["db"]).parent)
    assert f"flower-data:{state_dir}" in flower["volumes"], "state on a named volume"
    assert probe_url(flower) == f"http://127.0.0.1:{options['port']}/healthcheck"
    assert [port for _, _, port in published(flower)] == [options["port"]]


def test_only_the_pages_people_open_publish_ports_and_on_loopback_only(
    services: dict[str, dict[str, Any]],
) -> None:
    # Not all of them have authentication on every page (Flower's /metrics and /healthcheck,
    # all of Prometheus); the exporter has none at all and is reached on the compose network.
    publishing = {name for name, service in services.items() if service.get("ports")}
    assert publishing == {"flower", "prometheus", "grafana"}
    for name in publishing:
        for host, _, _ in published(services[name]):
            assert host == "127.0.0.1", f"{name} published beyond loopback"


def test_the_metrics_exporter_listens_where_prometheus_scrapes_it(
    services: dict[str, dict[str, Any]], parsed: Runs
) -> None:
    exporter = services["metrics"]
    assert service_argv(exporter)[3] == "metrics"
    params = report(parsed, "metrics command")["params"]
    # All interfaces in its container: Prometheus is another container.
    assert params["host"] == "0.0.0.0" and not params["once"]
    assert probe_url(exporter) == f"http://127.0.0.1:{params['port']}/metrics"
    prometheus = services["prometheus"]
    config = yaml.safe_load(in_container(prometheus, prometheus_config(prometheus)).read_text())
    targets = [
        target
        for job in config["scrape_configs"]
        for static in job.get("static_configs", [])
        for target in static["targets"]
    ]
    assert f"metrics:{params['port']}" in targets


def prometheus_config(service: dict[str, Any]) -> str:
    flags = dict(arg.split("=", 1) for arg in service_argv(service) if "=" in arg)
    return flags["--config.file"]


def test_prometheus_mounts_its_config_and_alert_rules_from_the_repository(
    services: dict[str, dict[str, Any]],
) -> None:
    prometheus = services["prometheus"]
    assert prometheus["image"].startswith("prom/prometheus:")
    # Every file the stack mounts from the repository exists, read-only in the container.
    mounts = [mount for service in services.values() for mount in bind_mounts(service)]
    assert mounts, "the stack mounts nothing from the repository?"
    for source, _, mode in mounts:
        assert source.exists(), f"{source.relative_to(ROOT)} is mounted but missing"
        assert mode == "ro", f"{source.relative_to(ROOT)} mounted writable"
    config_path = in_container(prometheus, prometheus_config(prometheus))
    assert config_path == ROOT / "ops/prometheus/prometheus.yml"
    config = yaml.safe_load(config_path.read_text())
    rules = [
        in_container(prometheus, str(PurePosixPath(prometheus_config(prometheus)).parent / rule))
        for rule in config["rule_files"]
    ]
    assert ROOT / "ops/prometheus/alerts.yml" in rules
    for rule in rules:
        assert rule.is_file(), f"rule file {rule} is not in the mounted directory"
        assert yaml.safe_load(rule.read_text())["groups"], rule
    assert any(t.endswith(":/prometheus") for t in prometheus["volumes"]), "TSDB on a volume"
    assert probe_url(prometheus) == "http://127.0.0.1:9090/-/healthy"
    assert [port for _, _, port in published(prometheus)] == [9090]


def test_tasks_write_to_the_image_data_volume(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    instructions = dockerfile_instructions()
    env_lines = " ".join(arg for op, arg in instructions if op == "ENV")
    assert "JOBS_APP_DATA=/data" in env_lines.split()
    assert any(op == "VOLUME" and "/data" in arg for op, arg in instructions)
    for name in worker_names():
        assert container_env(services[name])["JOBS_APP_DATA"] == "/data"
        assert any(str(v).endswith(":/data") for v in services[name]["volumes"]), name
    # The reference app's files (uploads, thumbnails, outbox) follow JOBS_APP_DATA.
    from tasks.paths import data_dir

    monkeypatch.setenv("JOBS_APP_DATA", "/data")
    assert data_dir() == Path("/data")


def test_dockerfile_runs_as_a_non_root_user_owning_the_data_volume() -> None:
    instructions = dockerfile_instructions()
    runtime = instructions[max(i for i, (op, _) in enumerate(instructions) if op == "FROM") :]
    assert runtime[0][1].startswith("python:3.11-slim")
    users = [arg for op, arg in runtime if op == "USER"]
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    user = users[-1].split(":")[0]
    assert any(op == "RUN" and f"chown {user}:" in arg and "/data" in arg for op, arg in runtime)
    # The ownership must be set before VOLUME: later changes to a volume path are discarded.
    ops = [op for op, _ in runtime]
    assert ops.index("VOLUME") > max(i for i, (op, a) in enumerate(runtime) if "chown" in a)


def test_dockerignore_keeps_environments_and_vcs_out_but_the_sources_in() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert {".venv", ".git", ".env"} <= set(patterns)
    assert not any(p.startswith("!") for p in patterns), "re-includes make the list hard to read"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    needed = ["pyproject.toml", project["readme"], *project.get("license-files", [])]
    for path in [*needed, "jobs_platform", "tasks"]:
        assert not any(fnmatch.fnmatch(path, p) for p in patterns), path


def test_the_image_can_import_the_app_it_runs() -> None:
    """The reference app is not in the package, so the image copies it onto the path."""
    instructions = dockerfile_instructions()
    runtime = instructions[max(i for i, (op, _) in enumerate(instructions) if op == "FROM") :]
    env = dict(pair.split("=", 1) for op, arg in runtime if op == "ENV" for pair in arg.split())
    top_level = env["JOBS_APP"].split(".")[0]
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packaged = any(fnmatch.fnmatch(top_level, p) for p in setuptools["packages"]["find"]["include"])
    workdir = [arg for op, arg in runtime if op == "WORKDIR"][-1]
    copies = [arg.split() for op, arg in runtime if op == "COPY" and "--from" not in arg]
    copied = [top_level, f"./{top_level}"] in copies
    on_path = workdir in env.get("PYTHONPATH", "").split(":")
    assert packaged or (copied and on_path), f"{top_level} is neither installed nor copied"


def test_grafana_is_provisioned_from_ops_with_prometheus_and_the_dashboard(
    services: dict[str, dict[str, Any]],
) -> None:
    grafana, prometheus = services["grafana"], services["prometheus"]
    assert grafana["image"].startswith("grafana/grafana:")
    assert grafana["depends_on"] == {"prometheus": {"condition": "service_healthy"}}
    # Grafana reads /etc/grafana/provisioning: both files come from the repository.
    sources = yaml.safe_load(
        in_container(grafana, "/etc/grafana/provisioning/datasources/prometheus.yml").read_text()
    )["datasources"]
    assert [(s["type"], s["url"], s["isDefault"]) for s in sources] == [
        ("prometheus", "http://prometheus:9090", True)
    ]
    assert [port for _, _, port in published(prometheus)] == [9090]  # where that URL points
    providers = yaml.safe_load(
        in_container(grafana, "/etc/grafana/provisioning/dashboards/jobs-platform.yml").read_text()
    )["providers"]
    assert [p["type"] for p in providers] == ["file"]
    folder = in_container(grafana, providers[0]["options"]["path"])
    assert folder == ROOT / "ops/grafana" and (folder / "dashboard.json").is_file()
    board = json.loads((folder / "dashboard.json").read_text())
    # The dashboard picks its data source through its variable: Prometheus, the default.
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    env = container_env(grafana)
    home = in_container(grafana, env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"])
    assert home == ROOT / "ops/grafana/dashboard.json"
    assert env["GF_SECURITY_ADMIN_PASSWORD"] == SECRETS["GRAFANA_PASSWORD"]
    assert any(v.endswith(":/var/lib/grafana") for v in grafana["volumes"]), "state on a volume"
    assert probe_url(grafana) == "http://127.0.0.1:3000/api/health"
    assert [port for _, _, port in published(grafana)] == [3000]
