"""ReliableTask options are validated when the task is declared (pure: no broker contact)."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from jobs_platform import ConfigError, ReliableTask, create_app
from jobs_platform.profiles import PROFILES


@pytest.fixture()
def app() -> Any:
    return create_app("unit", broker_url="memory://", result_backend="cache+memory://")


def body() -> None:
    return None


def test_decorator_form_resolves_policy_queue_and_limits(app: Any) -> None:
    task = app.task(
        base=ReliableTask,
        bind=True,
        name="u.call",
        queue="thirdparty",
        max_retries=5,
        retry_backoff=2,
        retry_backoff_max=300,
    )(body)
    assert task.retry_policy.max_retries == 5
    assert task.queue_class == "thirdparty"
    assert task.max_retries == 5  # Celery's own attribute agrees
    assert task.time_limit == PROFILES["thirdparty"].time_limit_s
    assert task.soft_time_limit < task.time_limit
    assert task.acks_late and task.reject_on_worker_lost and task.retry_on_worker_lost
    assert app.amqp.router.route({}, "u.call")["queue"].name == "thirdparty"


def test_class_form_and_settings_defaults(app: Any) -> None:
    class Charge(ReliableTask):
        name = "u.charge"
        queue = "heavy"

        def run(self, invoice_id: int) -> int:
            return invoice_id

    task = app.register_task(Charge())
    settings = app.jobs_settings
    assert task.retry_policy == settings.default_policy()
    assert task.queue_class == "heavy"
    assert "queue" not in Charge.__dict__  # moved into the routing table (Celery deprecates it)
    assert app.amqp.router.route({}, "u.charge")["queue"].name == "heavy"


def test_route_table_supplies_the_queue(app: Any) -> None:
    routed = create_app("unit2", broker_url="memory://", routes={"billing.*": "thirdparty"})
    task = routed.task(base=ReliableTask, name="billing.charge")(body)
    assert task.queue_class == "thirdparty"
    del app


BAD: list[tuple[dict[str, Any], str]] = [
    ({"queue": "fsat"}, "unknown queue 'fsat'; the known queues are fast, heavy, thirdparty"),
    ({}, "has no queue"),
    ({"queue": "fast", "max_retries": None}, "retry forever"),
    ({"queue": "fast", "max_retries": -1}, "between 0 and 1000"),
    ({"queue": "fast", "retry_backoff": -1}, "backoff_s must be > 0"),
    ({"queue": "fast", "retry_backoff": True}, "not a bool"),
    ({"queue": "fast", "retry_backoff": 10, "retry_backoff_max": 5}, "must be >= backoff_s"),
    # Waits of hours go to the delayed store; only JOBS_MAX_DELAY (30 days) bounds them.
    ({"queue": "fast", "retry_backoff_max": 31 * 86400}, "longer than JOBS_MAX_DELAY"),
    ({"queue": "fast", "time_limit": 10, "soft_time_limit": 20}, "soft_time_limit 20 s must be"),
    ({"queue": "fast", "time_limit": -5}, "must be > 0"),
    ({"queue": "fast", "autoretry_for": (KeyError,)}, "autoretry_for is not used"),
    ({"queue": "fast", "acks_late": False}, "acks_late is pinned"),
    ({"queue": "fast", "transient_errors": ("x",)}, "must hold exception classes"),
    ({"queue": "fast", "classifier": 42}, "classifier must be callable"),
]


def test_a_hard_limit_longer_than_the_visibility_timeout_is_allowed(app: Any) -> None:
    # A live worker's jobs are never swept (its lease keeps them fresh), so the visibility
    # timeout (3600 s) bounds no running job: a four-hour job is a fine declaration.
    task = app.task(base=ReliableTask, name="u.long", queue="heavy", time_limit=4 * 3600)(body)
    assert task.spec.time_limit_s == 4 * 3600


@pytest.mark.parametrize(("options", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_declarations_fail_at_declaration(
    app: Any, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        app.task(base=ReliableTask, name="u.bad", **options)(body)
    # The refused task is not left behind, and a corrected declaration works.
    assert "u.bad" not in app._tasks
    assert app.task(base=ReliableTask, name="u.bad", queue="fast")(body).queue_class == "fast"


def test_reliable_task_refuses_a_plain_celery_app() -> None:
    plain = Celery("plain", broker="memory://", set_as_current=False)
    with pytest.raises(ConfigError, match="create_app"):
        plain.task(base=ReliableTask, name="p.t", lazy=False, shared=False)(body)


def test_startup_check_refuses_a_visibility_timeout_changed_behind_our_back(app: Any) -> None:
    app.task(base=ReliableTask, name="u.ok", queue="fast")(body)
    app.conf.broker_transport_options = {"visibility_timeout": 20}
    with pytest.raises(ConfigError, match="visibility_timeout 20 s differs"):
        app.finalize()


def test_pinned_celery_configuration(app: Any) -> None:
    conf = app.conf
    assert conf.accept_content == ["json"] and conf.task_serializer == "json"
    assert conf.result_accept_content == ["json"]
    assert conf.task_acks_late and conf.task_reject_on_worker_lost
    assert conf.task_retry_on_worker_lost
    assert conf.task_create_missing_queues is False
    assert conf.worker_prefetch_multiplier == 1
    # JOBS_TASK_EVENTS=auto: off until a monitor asks (jobs_platform.events)
    assert conf.worker_send_task_events is False and conf.task_send_sent_event is False
    for options in (conf.broker_transport_options, conf.result_backend_transport_options):
        assert options["visibility_timeout"] == 3600
        assert options["unacked_restore_throttle"] == 1
    assert [q.name for q in conf.task_queues] == ["fast", "heavy", "thirdparty"]


def test_task_events_can_be_switched_off() -> None:
    quiet = create_app("quiet", broker_url="memory://", task_events=False)
    assert quiet.conf.worker_send_task_events is False
    assert quiet.conf.task_send_sent_event is False
