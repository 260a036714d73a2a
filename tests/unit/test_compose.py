"""docker-compose.yml is for users with Docker (none here): it parses and matches the profiles."""

from __future__ import annotations

from pathlib import Path

import yaml

from jobs_platform.profiles import PROFILES

ROOT = Path(__file__).resolve().parents[2]


def test_compose_runs_one_worker_per_profile_plus_the_services() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"redis", "postgres", "flower"} <= set(services)
    for queue in PROFILES:
        command = services[f"worker-{queue}"]["command"]
        assert command == ["celery", "-A", "tasks", "worker-profile", queue]
        assert services[f"worker-{queue}"]["environment"]["JOBS_BROKER_URL"].startswith("redis://")
    # Deploys wait for running tasks at least as long as the queue's hard time limit.
    heavy_grace = int(services["worker-heavy"]["stop_grace_period"].rstrip("s"))
    assert heavy_grace > PROFILES["heavy"].time_limit_s
