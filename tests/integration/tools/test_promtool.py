"""The monitoring material in ``ops/`` through the real ``promtool``: ``check rules``, the
alert rules' own unit tests (``test rules``), ``check config``, and every dashboard expression
parsed (promtool checks it as a recording rule). What needs no tool (the metric names, the
thresholds, the runbooks) is in tests/unit/test_ops.py.

promtool comes from Debian's ``prometheus`` package; when it is missing the session
installs it (as root, without starting the Prometheus service), or skips saying why.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.unit.test_ops import (
    ALERT_TESTS,
    ALERTS,
    CONFIG,
    GRAFANA_VARIABLE,
    ROOT,
    alert_rules,
    dashboard,
    panel_exprs,
    template_exprs,
)

pytestmark = pytest.mark.integration

POLICY_RC = Path("/usr/sbin/policy-rc.d")


def _prometheus_pids() -> set[int]:
    pids = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if os.readlink(proc / "exe") == "/usr/bin/prometheus":
                    pids.add(int(proc.name))
            except OSError:
                continue  # gone, or not ours to read
    return pids


def _apt_install_prometheus() -> str:
    """Install Debian's prometheus package for promtool, starting no service; the error."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [
        "apt-get",
        "install",
        "-y",
        "--no-install-recommends",
        "-o",
        "DPkg::Lock::Timeout=300",
        "prometheus",
    ]
    # invoke-rc.d asks policy-rc.d before starting a service: 101 = "do not".
    guard = not POLICY_RC.exists()
    if guard:
        POLICY_RC.write_text("#!/bin/sh\n# jobs-platform tests: start no service\nexit 101\n")
        POLICY_RC.chmod(0o755)
    before = _prometheus_pids()
    error = ""
    try:
        for step in ([install], [["apt-get", "update"], install]):  # lists may be missing
            for command in step:
                done = subprocess.run(
                    command, env=env, capture_output=True, text=True, timeout=540, check=False
                )
                if done.returncode:
                    error = f"{' '.join(command)}: {done.stderr.strip()[-500:]}"
                    break
            else:
                return ""
    finally:
        if guard:
            POLICY_RC.unlink()
        for pid in _prometheus_pids() - before:  # a daemon the install started anyway
            os.kill(pid, signal.SIGTERM)
    return error


@pytest.fixture(scope="session")
def promtool() -> str:
    found = shutil.which("promtool")
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip(
            "promtool is not installed and cannot be installed here (needs root and apt-get): "
            "apt-get install --no-install-recommends prometheus"
        )
    error = _apt_install_prometheus()
    found = shutil.which("promtool")
    if not found:
        pytest.skip(f"promtool could not be installed: {error or 'not on PATH after install'}")
    return found


def run_promtool(promtool: str, *args: str | Path) -> str:
    done = subprocess.run(
        [promtool, *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"promtool {' '.join(map(str, args))} failed:\n{output}"
    return output


@pytest.mark.timeout(600)  # the first use may install promtool
def test_promtool_accepts_the_alert_rules(promtool: str) -> None:
    output = run_promtool(promtool, "check", "rules", ALERTS.relative_to(ROOT))
    assert f"{len(alert_rules())} rules found" in output


@pytest.mark.timeout(600)
def test_promtool_unit_tests_of_the_alert_rules_pass(promtool: str) -> None:
    output = run_promtool(promtool, "test", "rules", ALERT_TESTS.relative_to(ROOT))
    assert "SUCCESS" in output


@pytest.mark.timeout(600)
def test_promtool_accepts_the_scrape_config_and_its_rule_files(promtool: str) -> None:
    output = run_promtool(promtool, "check", "config", CONFIG.relative_to(ROOT))
    assert "1 rule files found" in output
    assert f"{len(alert_rules())} rules found" in output


@pytest.mark.timeout(600)
def test_promtool_parses_every_dashboard_expression(promtool: str, tmp_path: Path) -> None:
    # Grafana's variables become what they stand for: a range, or "anything" in a regex.
    def substitute(expr: str) -> str:
        def value(match: re.Match[str]) -> str:
            name = match.group().strip("${}[]")
            return "5m" if name in {"__rate_interval", "__interval", "__range"} else ".*"

        return GRAFANA_VARIABLE.sub(value, expr)

    board = dashboard()
    exprs = panel_exprs(board) + template_exprs(board)
    rules = [
        {"record": f"dashboard:expr_{i}", "expr": substitute(expr)}
        for i, (_, expr) in enumerate(exprs)
    ]
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    output = run_promtool(promtool, "check", "rules", path)
    assert f"{len(rules)} rules found" in output
