"""TaskSpec: the declaration as data, and the retry decision it makes (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from jobs_platform.errors import ConfigError, PermanentError, TransientError
from jobs_platform.settings import Settings
from jobs_platform.spec import GiveUp, RetryIn, TaskSpec, resolve

SETTINGS = Settings.load(environ={})


def run(self: Any, invoice_id: int) -> None: ...


def spec(**declared: Any) -> TaskSpec:
    return resolve("billing.charge", declared, settings=SETTINGS, routed_queue=None, run=run)


def test_defaults_come_from_the_settings_and_the_queue_profile() -> None:
    s = spec(queue="thirdparty")
    assert s.policy == SETTINGS.default_policy()
    assert (s.time_limit_s, s.soft_time_limit_s) == (60.0, 50.0)
    assert s.celery_attributes() == {
        "max_retries": 5,
        "default_retry_delay": 2.0,
        "time_limit": 60.0,
        "soft_time_limit": 50.0,
        "rate_limit": None,  # Celery's own per-worker limit stays off; the global one is ours
    }


def test_a_route_gives_the_queue_and_a_declared_queue_wins() -> None:
    routed = resolve("x", {}, settings=SETTINGS, routed_queue="heavy", run=run)
    assert routed.queue == "heavy"
    assert resolve("x", {"queue": "fast"}, settings=SETTINGS, routed_queue="heavy", run=run).queue
    with pytest.raises(ConfigError, match="has no queue"):
        resolve("x", {}, settings=SETTINGS, routed_queue=None, run=run)


def test_the_spec_is_frozen() -> None:
    s = spec(queue="fast")
    with pytest.raises(AttributeError):
        s.queue = "heavy"  # type: ignore[misc]


def test_refusals_name_the_task() -> None:
    with pytest.raises(ConfigError, match=r"task 'billing.charge': max_retries must be between"):
        spec(queue="fast", max_retries=5000)
    with pytest.raises(ConfigError, match="business_key 'order' is not an argument"):
        spec(queue="fast", business_key=("order",))


class Rng:
    def uniform(self, low: float, high: float) -> float:
        return high


def test_decide_retries_then_gives_up_exhausted() -> None:
    s = spec(queue="fast", max_retries=2, retry_backoff=1, retry_backoff_max=4, rng=Rng())
    assert s.decide(TransientError("x"), 1) == RetryIn(1.0, "TransientError")
    assert s.decide(TransientError("x"), 2) == RetryIn(2.0, "TransientError")
    step = s.decide(TransientError("x"), 3)
    assert isinstance(step, GiveUp) and step.outcome == "exhausted"


def test_decide_gives_up_at_once_on_a_permanent_error() -> None:
    step = spec(queue="fast").decide(PermanentError("gone"), 1)
    assert step == GiveUp("permanent", "PermanentError")


def test_retry_after_is_honoured_up_to_the_cap() -> None:
    s = spec(queue="fast", retry_backoff=1, retry_backoff_max=10, rng=Rng())
    step = s.decide(TransientError("busy", retry_after_s=60), 1)
    assert step == RetryIn(10.0, "TransientError", retry_after_s=60)


def test_declared_exception_lists_steer_the_decision() -> None:
    class Busy(Exception): ...

    s = spec(queue="fast", transient_errors=(ValueError,), permanent_errors=[Busy])
    assert isinstance(s.decide(ValueError("normally permanent"), 1), RetryIn)
    assert isinstance(s.decide(Busy(), 1), GiveUp)
