"""The container recipe (docker-compose.yml, Dockerfile, .env.example, .dockerignore).

No Docker engine runs here, so the files are checked for what they promise, and every
``celery`` command compose runs (services and health checks) is run for real against this
project's CLI with ``--help`` or ``--print``, which parse the command without starting it.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobs_platform.profiles import PROFILES

ROOT = Path(__file__).resolve().parents[2]
CELERY = str(Path(sys.executable).parent / "celery")
#: Stand-ins for the values .env.example leaves empty (compose refuses to start without them).
SECRETS = {"POSTGRES_PASSWORD": "pg-secret", "FLOWER_PASSWORD": "flower-secret"}
#: Docker sets $HOSTNAME in a container to the name Celery's %h expands to.
CONTAINER_HOSTNAME = "c0ffee"

# $$ is a literal $; otherwise ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error}...
COMPOSE_VAR = re.compile(r"\$\$|\$\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


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
    assert isinstance(command, list), "commands in exec form, so signals reach Celery"
    return [interpolate(str(part), compose_env()) for part in command]


def healthcheck_argv(service: dict[str, Any]) -> list[str]:
    kind, *rest = service["healthcheck"]["test"]
    if kind == "CMD":
        return [interpolate(str(part), compose_env()) for part in rest]
    assert kind == "CMD-SHELL" and len(rest) == 1, service["healthcheck"]
    # The container's shell expands $NAME from the service's environment.
    shell_env = {**container_env(service), "HOSTNAME": CONTAINER_HOSTNAME}
    line = interpolate(str(rest[0]), compose_env())
    expanded = re.sub(r"\$(\w+)", lambda m: shell_env[m[1]], line)
    return shlex.split(expanded)


def run_celery(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    assert argv[0] == "celery", argv
    # The host's own JOBS_*/FLOWER_* settings must not leak in: the service's env only.
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JOBS_", "FLOWER_"))}
    return subprocess.run(
        [CELERY, *argv[1:]],
        env={**base, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    instructions = [line.split(None, 1) for line in lines if line and not line.startswith("#")]
    return [(parts[0].upper(), parts[1] if len(parts) > 1 else "") for parts in instructions]


def worker_names() -> list[str]:
    return [f"worker-{queue}" for queue in PROFILES]


def test_compose_runs_one_worker_per_profile_plus_the_services(
    services: dict[str, dict[str, Any]],
) -> None:
    assert {"redis", "postgres", "migrate", "flower"} <= set(services)
    for queue in PROFILES:
        worker = services[f"worker-{queue}"]
        assert worker["command"][:5] == [
            "celery",
            "-A",
            "${JOBS_APP:-tasks}",
            "worker-profile",
            queue,
        ]
        assert container_env(worker)["JOBS_BROKER_URL"].startswith("redis://")
    # Deploys wait for running tasks at least as long as the queue's hard time limit.
    heavy_grace = int(services["worker-heavy"]["stop_grace_period"].rstrip("s"))
    assert heavy_grace > PROFILES["heavy"].time_limit_s


def test_every_long_running_service_has_a_healthcheck(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, service in services.items():
        if name == "migrate":
            assert service["restart"] == "no", "a one-shot job is not restarted"
            assert "healthcheck" not in service
            continue
        assert service.get("healthcheck", {}).get("test"), f"{name} has no health check"


def test_workers_wait_for_the_one_shot_migration(services: dict[str, dict[str, Any]]) -> None:
    migrate = services["migrate"]
    assert service_argv(migrate)[3:] == ["db", "upgrade"]
    assert migrate["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    for name in worker_names():
        depends = services[name]["depends_on"]
        assert depends["migrate"] == {"condition": "service_completed_successfully"}, name
        assert depends["redis"] == {"condition": "service_healthy"}, name
        # Migrating once, before any worker, instead of every worker racing at start.
        assert container_env(services[name])["JOBS_AUTO_MIGRATE"] == "false"


def runs_env(services: dict[str, dict[str, Any]], key: str) -> dict[str, str]:
    name = key.split()[0]
    return container_env(services[name]) if name in services else {}


def celery_commands(services: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """Every celery argv compose runs (commands, health checks), keyed by service/kind."""
    found = {}
    for name, service in services.items():
        if "command" in service and service_argv(service)[0] == "celery":
            found[f"{name} command"] = service_argv(service)
        if service.get("healthcheck") and healthcheck_argv(service)[0] == "celery":
            found[f"{name} healthcheck"] = healthcheck_argv(service)
    return found


@pytest.fixture(scope="module")
def parsed(
    services: dict[str, dict[str, Any]],
) -> dict[str, tuple[list[str], subprocess.CompletedProcess[str]]]:
    """Each command run for real, parsed but not started, in its service's environment.

    A worker command runs with ``--print`` (it parses every option and shows the real
    ``celery worker`` argv); any other with ``--help``, once per distinct shape (the three
    health checks differ only in the node name).
    """
    runs: dict[str, tuple[list[str], dict[str, str]]] = {}
    shapes = set()
    for key, argv in celery_commands(services).items():
        env = container_env(services[key.split()[0]])
        if argv[3] == "worker-profile":
            runs[key] = ([*argv, "--print"], env)
            continue
        shape = tuple(re.sub("|".join(PROFILES), "QUEUE", part) for part in argv)
        if shape not in shapes:
            shapes.add(shape)
            runs[key] = ([*argv, "--help"], env)
        if argv[3] == "inspect":
            # --help does not check the action (`inspect pong --help` passes); --list has them.
            runs["inspect --list"] = ([*argv[:4], "--list"], env)
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = pool.map(lambda run: run_celery(*run), runs.values())
        return {
            key: (run[0], result) for (key, run), result in zip(runs.items(), results, strict=True)
        }


def test_every_celery_command_compose_runs_exists(
    services: dict[str, dict[str, Any]],
    parsed: dict[str, tuple[list[str], subprocess.CompletedProcess[str]]],
) -> None:
    # Workers and their health checks, migrate, flower.
    assert len(celery_commands(services)) == 2 * len(PROFILES) + 2
    for key, (argv, result) in parsed.items():
        assert argv[1:3] == ["-A", "tasks"], key
        assert result.returncode == 0, f"{shlex.join(argv)}: {result.stdout}{result.stderr}"
        # No complaint about a variable compose sets (a JOBS_* typo only gets a warning).
        env = runs_env(services, key)
        assert not [name for name in env if name in result.stderr], result.stderr
        if argv[-1] == "--help":
            assert f"Usage: celery {argv[3]}" in result.stdout, key
        elif argv[-1] == "--print":
            assert shlex.split(result.stdout)[3] == "worker", key
    # `inspect --list` prints "  action   help", help lines wrapping deeper indented.
    listing = parsed["inspect --list"][1].stdout
    inspect_actions = set(re.findall(r"^  (\w+)", listing, flags=re.MULTILINE))
    assert "ping" in inspect_actions, listing
    for key, argv in celery_commands(services).items():
        if argv[3] == "inspect":
            assert argv[4] in inspect_actions, f"{key}: no inspect action {argv[4]!r}"


def test_worker_node_names_match_their_health_checks(
    services: dict[str, dict[str, Any]],
    parsed: dict[str, tuple[list[str], subprocess.CompletedProcess[str]]],
) -> None:
    """The ping goes to the node each worker really starts as (``--print`` shows it)."""
    for queue in PROFILES:
        service = services[f"worker-{queue}"]
        _, printed = parsed[f"worker-{queue} command"]
        assert printed.returncode == 0, printed.stderr
        worker = shlex.split(printed.stdout)
        assert worker[worker.index("-Q") + 1] == queue
        node = worker[worker.index("-n") + 1].replace("%h", CONTAINER_HOSTNAME)
        ping = healthcheck_argv(service)
        assert ping[3:5] == ["inspect", "ping"]
        assert ping[ping.index("-d") + 1] == node
        if queue == "heavy":
            concurrency = compose_env()["HEAVY_CONCURRENCY"]
            assert worker[worker.index("-c") + 1] == concurrency


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


def test_flower_needs_a_password_and_is_published_on_loopback_only(
    services: dict[str, dict[str, Any]],
) -> None:
    from flower.options import default_options

    flower = services["flower"]
    env = container_env(flower)
    assert env["FLOWER_BASIC_AUTH"] == f"admin:{SECRETS['FLOWER_PASSWORD']}"
    # Flower silently ignores a FLOWER_* name that is not one of its options.
    for name in env:
        if name.startswith("FLOWER_"):
            assert name.removeprefix("FLOWER_").lower() in default_options, name
    assert not any("auth" in part for part in flower["command"]), "password kept out of argv"
    # /metrics and /healthcheck answer without the password: never on a public interface.
    assert flower["ports"] and all(str(p).startswith("127.0.0.1:") for p in flower["ports"])
    for name, service in services.items():
        if name != "flower":
            assert not service.get("ports"), f"{name} publishes a port"


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
