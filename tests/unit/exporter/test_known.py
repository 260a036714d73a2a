"""Every label value the exporter knows from the app is served at 0 before anything
happened (pure: the exporter's tables, no Redis)."""

from __future__ import annotations

from typing import Any

from jobs_platform import ReliableTask, create_app
from jobs_platform.exporter.collector import counter_families
from jobs_platform.exporter.known import label_values
from jobs_platform.metrics import names
from jobs_platform.metrics.counters import encode_field


def app_with_tasks() -> Any:
    app = create_app("known", broker_url="memory://")

    @app.task(base=ReliableTask, name="k.charge", queue="thirdparty", rate_limit="5/s")
    def charge() -> None: ...

    @app.task(base=ReliableTask, name="k.resize", queue="heavy")
    def resize() -> None: ...

    app.conf.beat_schedule = {"nightly": {"task": "k.resize", "schedule": 86400.0}}
    return app


def test_known_label_values_come_from_the_apps_tasks_queues_and_entries() -> None:
    known = label_values(app_with_tasks())
    assert ("k.charge", "thirdparty") in known[names.TASK_SUCCEEDED.name]
    assert ("k.resize", "heavy") in known[names.TASK_STARTED.name]
    assert ("k.charge", "thirdparty", "exhausted") in known[names.DEAD_LETTERS.name]
    assert ("(poison)", "heavy", "poison") in known[names.DEAD_LETTERS.name]
    assert ("k.charge", "thirdparty", "poison") not in known[names.DEAD_LETTERS.name]
    assert known[names.RATE_DEFERRED.name] == [("k.charge",)]
    assert known[names.BEAT_SENT.name] == [("nightly",)]
    assert ("lost",) in known[names.DEAD_LETTER_WRITE_FAILURES.name]
    assert all(not name.startswith("celery.") for name, _ in known[names.TASK_RECEIVED.name])


def test_an_unrecorded_known_series_is_served_at_zero_and_a_recorded_one_as_recorded() -> None:
    known = {names.TASK_SUCCEEDED.name: [("k.charge", "thirdparty"), ("k.resize", "heavy")]}
    field = encode_field(("celery_task_succeeded_total", ("k.resize", "heavy")))
    recorded = {field.encode(): b"3"}
    [family] = [f for f in counter_families(recorded, known) if f.name == "celery_task_succeeded"]
    values = {
        tuple(s.labels.values()): s.value for s in family.samples if s.name.endswith("_total")
    }
    assert values == {("k.charge", "thirdparty"): 0.0, ("k.resize", "heavy"): 3.0}
