"""The metrics table: complete, valid Prometheus names, documented (pure)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from jobs_platform.metrics import names

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "metrics.md"
BEGIN, END = "<!-- metrics:begin -->", "<!-- metrics:end -->"


@pytest.mark.parametrize("metric", names.ALL, ids=lambda m: m.name)
def test_each_name_and_label_is_a_valid_prometheus_name(metric: names.Metric) -> None:
    assert names.METRIC_NAME.match(metric.name)
    assert metric.name.startswith(("celery_", "jobs_"))
    # Counters end in _total (OpenMetrics); nothing else may, or a counter's family
    # name would clash with it.
    assert metric.name.endswith("_total") == (metric.kind == "counter")
    assert metric.help.strip() and "\n" not in metric.help
    assert len(set(metric.labels)) == len(metric.labels)
    for label in metric.labels:
        assert names.LABEL_NAME.match(label) and not label.startswith("__")
        assert label not in ("le", "quantile")  # reserved by histograms and summaries
    if metric.kind == "histogram":
        assert metric.source == "recorded"  # observed where the work happens
    if metric.source == "recorded":
        assert metric.kind != "gauge"  # summing gauges over processes means nothing


def test_no_two_metrics_share_a_sample_or_family_name() -> None:
    samples = [sample for metric in names.ALL for sample in metric.samples]
    assert len(samples) == len(set(samples))
    families = [metric.family for metric in names.ALL]
    assert len(families) == len(set(families))
    assert not set(families) & (set(samples) - set(families))


def test_exposed_names_list_every_sample() -> None:
    exposed = names.exposed_names()
    assert "celery_task_runtime_bucket" in exposed and "celery_queue_length" in exposed
    assert "celery_task_runtime" not in exposed  # a histogram has no bare sample
    assert names.BY_NAME["celery_queue_length"] is names.QUEUE_LENGTH


def test_runtime_buckets_rise_and_end_at_infinity() -> None:
    edges = names.RUNTIME_BUCKETS
    assert list(edges) == sorted(set(edges)) and edges[-1] == float("inf")


def test_every_platform_counter_in_the_process_registry_is_in_the_table() -> None:
    # Importing the modules that define counters registers them; a counter defined outside
    # the table would be invisible to the exporter and to the ops checks.
    for module in (
        "jobs_platform.cheap_retry",
        "jobs_platform.deadletter.metrics",
        "jobs_platform.idempotency.events",
        "jobs_platform.ratelimit",
        "jobs_platform.schedule.metrics",
    ):
        importlib.import_module(module)
    registered = {
        family.name for family in REGISTRY.collect() if family.name.startswith(("jobs_", "celery_"))
    }
    in_table = {metric.family for metric in names.ALL}
    assert registered and registered <= in_table


def test_the_docs_page_has_the_generated_table() -> None:
    page = PAGE.read_text(encoding="utf-8")
    assert page.count(BEGIN) == 1 and page.count(END) == 1, "metrics table markers"
    block = page.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert block == names.markdown_table(), (
        "docs/metrics.md is out of date: paste jobs_platform.metrics.names.markdown_table()"
    )
