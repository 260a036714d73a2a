"""The monitoring material in ``ops/``: Prometheus alert rules, the Grafana dashboard and the
runbooks, checked against the exporter's metric table and the real ``promtool``.

- every metric an alert rule or a dashboard panel names is one the exporter serves
  (``jobs_platform.metrics.names.exposed_names()``), read by a small PromQL tokenizer
  (promtool parses but has no command that lists an expression's metrics);
- the per-queue thresholds equal ``Settings().queue_objectives``, so they cannot drift;
- every alert has a severity, a summary, a runbook that exists, and promtool unit tests
  that show it firing and quiet;
- ``promtool check rules`` / ``test rules`` / ``check config`` pass, and every dashboard
  expression parses (promtool checks it as a recording rule): in
  tests/integration/tools/test_promtool.py, since promtool may have to be installed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobs_platform.metrics.names import exposed_names
from jobs_platform.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = ROOT / "ops" / "prometheus"
ALERTS = PROMETHEUS_DIR / "alerts.yml"
ALERT_TESTS = PROMETHEUS_DIR / "alerts.test.yml"
CONFIG = PROMETHEUS_DIR / "prometheus.yml"
DASHBOARD = ROOT / "ops" / "grafana" / "dashboard.json"
PROVISIONING = ROOT / "ops" / "grafana" / "provisioning"
ALERTS_DOC = ROOT / "docs" / "alerts.md"

SEVERITIES = {"critical", "warning"}

# -- a PromQL tokenizer, just enough to list the metric names of an expression --------------


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


FUNCTIONS = _words(
    """
    abs absent absent_over_time acos acosh asin asinh atan atanh avg_over_time ceil changes
    clamp clamp_max clamp_min cos cosh count_over_time day_of_month day_of_week day_of_year
    days_in_month deg delta deriv exp floor histogram_quantile holt_winters hour idelta
    increase irate label_join label_replace last_over_time ln log10 log2 max_over_time
    min_over_time minute month pi predict_linear present_over_time quantile_over_time rad
    rate resets round scalar sgn sin sinh sort sort_desc sqrt stddev_over_time
    stdvar_over_time sum_over_time tan tanh time timestamp vector year
    start end
    """
)
AGGREGATIONS = _words(
    "avg bottomk count count_values group max min quantile stddev stdvar sum topk"
)
KEYWORDS = _words("and or unless by without on ignoring group_left group_right offset bool inf nan")
GRAFANA_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+|\[\[\w+\]\]")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
# Numbers, durations (10m, 1h30m), hex and exponents: a token that starts with a digit.
_NUMBER = re.compile(r"(?<![\w:])\.?\d[\w.]*(?:[eE][+-]?\d+)?")
_IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


class PromQLNameError(ValueError):
    """An expression this checker cannot vouch for."""


def metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` selects (functions, keywords and label names left out)."""
    text = GRAFANA_VARIABLE.sub(" ", expr)
    for matchers in _MATCHERS.findall(_STRING.sub('""', text)):
        if "__name__" in matchers:
            # A name given as a label (maybe a regex) cannot be checked against the table.
            raise PromQLNameError(f"selects by __name__, name the metric instead: {expr!r}")
    text = _STRING.sub('""', text)
    text = _MATCHERS.sub(" ", text)  # label names and values
    text = _RANGE.sub(" ", text)  # [5m], [1h:1m]
    text = _GROUPING.sub(r"\1", text)  # by (queue_name), on (), group_left (x)
    text = _NUMBER.sub(" ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        word = match.group()
        called = text[match.end() :].lstrip().startswith("(")
        if word.lower() in KEYWORDS or word in AGGREGATIONS:
            continue
        if word in FUNCTIONS:
            continue
        if called:
            raise PromQLNameError(f"unknown PromQL function {word!r} in {expr!r}")
        names.add(word)
    return names


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("celery_worker_up == 0", {"celery_worker_up"}),
        (
            "histogram_quantile(0.95, sum by (le, queue_name) (rate(celery_task_runtime_bucket"
            '{queue_name=~"$queue"}[$__rate_interval])))',
            {"celery_task_runtime_bucket"},
        ),
        (
            'sum by (stage) (x_total{stage=~"lost|on"} unless x_total offset 10m) or on () y < 6e2',
            {"x_total", "y"},
        ),
        ('label_replace(vector(60), "queue_name", "fast", "", "") or time() - z', {"z"}),
        (
            "sum(rate(a:b:rate5m[5m:1m])) without (instance) / ignoring(le) group_left c",
            {
                "a:b:rate5m",
                "c",
            },
        ),
    ],
)
def test_the_tokenizer_finds_exactly_the_metric_names(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


@pytest.mark.parametrize(
    ("expr", "complaint"),
    [
        ('{__name__=~"celery_.*"}', "__name__"),
        ("rates(celery_task_failed_total[5m])", "unknown PromQL function 'rates'"),
    ],
)
def test_the_tokenizer_refuses_what_it_cannot_check(expr: str, complaint: str) -> None:
    with pytest.raises(PromQLNameError, match=re.escape(complaint)):
        metric_names(expr)


# -- the files ------------------------------------------------------------------------------


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def alert_rules() -> list[dict[str, Any]]:
    groups = load_yaml(ALERTS)["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def dashboard() -> dict[str, Any]:
    loaded = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", ())  # a collapsed row keeps its panels inside


def panel_exprs(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, expr) of every panel target."""
    return [
        (f"panel {panel['id']} {panel['title']!r} target {target['refId']}", target["expr"])
        for panel in panels(board)
        for target in panel.get("targets", ())
    ]


def template_exprs(board: dict[str, Any]) -> list[tuple[str, str]]:
    """The PromQL inside the dashboard's query variables (``label_values(expr, label)``)."""
    found = []
    for variable in board["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]
        query = query["query"] if isinstance(query, dict) else query
        call = re.fullmatch(r"label_values\((?:(?P<expr>.+),\s*)?(?P<label>\w+)\)", query)
        assert call, f"variable {variable['name']}: only label_values(...) is checked: {query}"
        if call["expr"]:
            found.append((f"variable {variable['name']}", call["expr"]))
    return found


def test_every_metric_an_alert_rule_names_is_served_by_the_exporter() -> None:
    served = exposed_names()
    unknown = {}
    for rule in alert_rules():
        names = metric_names(rule["expr"])
        assert names, f"{rule['alert']}: its expression names no metric"
        if names - served:
            unknown[rule["alert"]] = sorted(names - served)
    assert not unknown, f"alert rules name metrics the exporter does not serve: {unknown}"


def test_every_metric_a_dashboard_panel_names_is_served_by_the_exporter() -> None:
    board = dashboard()
    served = exposed_names()
    exprs = panel_exprs(board) + template_exprs(board)
    unknown = {where: sorted(metric_names(e) - served) for where, e in exprs}
    assert not {k: v for k, v in unknown.items() if v}, "panels name metrics nobody serves"
    named = set().union(*(metric_names(e) for _, e in exprs))
    # What an on-call person needs on one screen (docs/alerts.md lists the panels).
    wanted = {
        "celery_queue_length",
        "jobs_queue_oldest_age_seconds",
        "celery_task_succeeded_total",
        "celery_task_failed_total",
        "celery_task_retried_total",
        "celery_task_runtime_bucket",
        "jobs_inflight",
        "jobs_dead_letters_total",
        "jobs_dead_letter_spool_depth",
        "jobs_delayed_depth",
        "jobs_delayed_next_due_timestamp_seconds",
        "jobs_beat_last_tick_timestamp_seconds",
        "celery_worker_up",
    }
    assert wanted <= named, f"the dashboard shows nothing of {sorted(wanted - named)}"


def objective_thresholds() -> dict[str, float]:
    """Queue -> threshold of the JobsQueueOverObjective rules."""
    found = {}
    for rule in alert_rules():
        if rule["alert"] != "JobsQueueOverObjective":
            continue
        match = re.fullmatch(
            r'max by \(queue_name\) \(jobs_queue_oldest_age_seconds\{queue_name="(\w+)"\}\)'
            r" > ([\d.]+)",
            rule["expr"].strip(),
        )
        assert match, f"unexpected JobsQueueOverObjective expression: {rule['expr']}"
        queue, threshold = match.groups()
        assert queue not in found, f"two objective rules for {queue}"
        assert rule["labels"]["queue_name"] == queue
        assert f"(objective {threshold} s)" in rule["annotations"]["summary"]
        found[queue] = float(threshold)
    return found


def test_queue_objective_thresholds_are_the_settings_defaults() -> None:
    # Static YAML cannot read JOBS_QUEUE_OBJECTIVES: a changed default must change both.
    assert objective_thresholds() == Settings().queue_objectives


def test_the_dashboard_draws_the_same_objectives() -> None:
    drawn = {}
    for panel in panels(dashboard()):
        for target in panel.get("targets", ()):
            match = re.fullmatch(r"vector\(([\d.]+)\)", target["expr"])
            if match:
                drawn[target["legendFormat"].removesuffix(" objective")] = float(match[1])
    assert drawn == Settings().queue_objectives


def test_every_alert_has_severity_summary_and_an_existing_runbook() -> None:
    doc = ALERTS_DOC.read_text(encoding="utf-8")
    for rule in alert_rules():
        name = rule["alert"]
        assert rule["labels"]["severity"] in SEVERITIES, name
        assert rule["annotations"]["summary"].strip(), name
        runbook = ROOT / rule["annotations"]["runbook_url"]
        assert runbook.parent == ROOT / "ops" / "runbooks" and runbook.is_file(), (name, runbook)
        assert name in runbook.read_text(encoding="utf-8"), f"{runbook.name} never names {name}"
        assert f"`{name}`" in doc, f"docs/alerts.md does not describe {name}"
        # A single scrape never fires an alert: a window in the expression, or a `for:`.
        assert "[" in rule["expr"] or rule.get("for"), f"{name}: one scrape would fire it"


def test_every_alert_is_tested_firing_and_quiet() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in load_yaml(ALERT_TESTS)["tests"]:
        for check in case.get("alert_rule_test", ()):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {rule["alert"] for rule in alert_rules()}
    assert names - firing == set(), "alerts never shown firing"
    assert names - quiet == set(), "alerts never shown quiet"
    assert (firing | quiet) - names == set(), "tests of alerts that do not exist"


def test_the_dashboard_is_importable_and_uses_the_datasource_variable() -> None:
    board = dashboard()
    assert board["schemaVersion"] >= 36 and board["uid"] and board["title"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    ids = [panel["id"] for panel in panels(board)]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for panel in panels(board):
        x, w = panel["gridPos"]["x"], panel["gridPos"]["w"]
        assert x >= 0 and x + w <= 24, f"panel {panel['title']!r} leaves the 24-column grid"
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        for holder in (panel, *panel["targets"]):
            assert holder["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}


def test_grafana_provisioning_points_at_the_dashboard_and_prometheus() -> None:
    sources = load_yaml(PROVISIONING / "datasources" / "prometheus.yml")["datasources"]
    assert [(s["type"], s["url"]) for s in sources] == [("prometheus", "http://prometheus:9090")]
    providers = load_yaml(PROVISIONING / "dashboards" / "jobs-platform.yml")["providers"]
    assert providers[0]["type"] == "file" and providers[0]["options"]["path"]


def test_the_scrape_config_scrapes_the_exporter_and_loads_the_rules() -> None:
    config = load_yaml(CONFIG)
    assert config["rule_files"] == ["alerts.yml"]
    targets = [
        target
        for job in config["scrape_configs"]
        for static in job["static_configs"]
        for target in static["targets"]
    ]
    assert targets == ["metrics:9808"]
