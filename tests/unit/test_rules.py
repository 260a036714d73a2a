"""Each "refuse this configuration" rule with its message, in milliseconds (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from jobs_platform import routing, rules
from jobs_platform.errors import ConfigError, DispatchError


def test_check_queue_names_the_known_queues() -> None:
    assert routing.check_queue("heavy", what="x") == "heavy"
    with pytest.raises(ConfigError, match=r"task 't': unknown queue 'slow'; .*fast, heavy, third"):
        routing.check_queue("slow", what="task 't'")


@pytest.mark.parametrize("value", [0, -1, True, "5", float("nan")])
def test_check_positive(value: Any) -> None:
    with pytest.raises(ConfigError, match=r"dispatch_timeout must be > 0 seconds"):
        rules.check_positive(value, what="dispatch_timeout")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((None, 1, 2), "None would mean 'retry forever'"),
        ((True, 1, 2), "max_retries must be an int"),
        ((1001, 1, 2), "between 0 and 1000"),
        ((3, 0, 2), "backoff_s must be > 0"),
        ((3, float("inf"), 2), "backoff_s must be a finite number"),
        ((3, 5, 2), r"backoff_max_s \(2\) must be >= backoff_s \(5\)"),
    ],
)
def test_check_retry_policy(args: tuple[Any, Any, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        rules.check_retry_policy(*args)


def test_unknown_env_hints_only_near_misses() -> None:
    hints = rules.unknown_env_hints(
        ["JOBS_TASK_EVENT", "JOBS_APP", "PATH", "JOBS_TASK_EVENTS"], ["JOBS_TASK_EVENTS"]
    )
    assert hints == {"JOBS_TASK_EVENT": "JOBS_TASK_EVENTS"}


def test_declared_option_names() -> None:
    known = {"transient_errors", "max_retries"}
    rules.check_declared_option_names(["max_retries"], task="'t'", known=known)
    with pytest.raises(ConfigError, match=r"unknown option 'transient_error'; did you mean"):
        rules.check_declared_option_names(["transient_error"], task="'t'", known=known)
    with pytest.raises(ConfigError, match=r"unknown option 'zzz'$"):
        rules.check_declared_option_names(["zzz"], task="'t'", known=known)


def test_declared_attribute_names_leave_the_apps_own_attributes_alone() -> None:
    attrs = {"endpoint": "https://x", "helper": lambda: None, "_private": 1, "max_retries": 2}
    rules.check_declared_attribute_names(
        attrs, task="t", known={"max_retries"}, options={"max_retries", "transient_errors"}
    )
    with pytest.raises(ConfigError, match="did you mean 'transient_errors'"):
        rules.check_declared_attribute_names(
            {"transient_error": ()}, task="t", known=set(), options={"transient_errors"}
        )


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        ({"autoretry_for": (KeyError,)}, "autoretry_for is not used with ReliableTask"),
        ({"retry_kwargs": {"max_retries": 3}}, "retry_kwargs is not used"),
        ({"acks_late": False}, "acks_late is pinned to True"),
        ({"reject_on_worker_lost": False}, "reject_on_worker_lost is pinned"),
    ],
)
def test_declared_not_refused(declared: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        rules.check_declared_not_refused(declared, task="t")


def test_declared_retries() -> None:
    with pytest.raises(ConfigError, match="max_retries=None would retry forever"):
        rules.check_declared_retries({"max_retries": None}, task="t")
    with pytest.raises(ConfigError, match="retry_backoff is a number of seconds, not a bool"):
        rules.check_declared_retries({"retry_backoff": True}, task="t")


def test_exception_types_classifier_business_key_unique_for() -> None:
    assert rules.check_exception_types(KeyError, task="t", attr="transient_errors") == (KeyError,)
    with pytest.raises(ConfigError, match="transient_errors must hold exception classes"):
        rules.check_exception_types(["KeyError"], task="t", attr="transient_errors")
    with pytest.raises(ConfigError, match="classifier must be callable"):
        rules.check_classifier("nope", task="t")

    def run(self: Any, order_id: int) -> None: ...

    assert rules.check_business_key("order_id", run, task="t") == ("order_id",)
    with pytest.raises(ConfigError, match=r"business_key 'order' is not an argument"):
        rules.check_business_key(("order",), run, task="t")
    assert rules.check_unique_for(30, task="t") == 30.0
    for bad in (0, True, "60"):
        with pytest.raises(ConfigError, match="unique_for is a number of seconds"):
            rules.check_unique_for(bad, task="t")


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"hard_limit_s": None}, "has no hard time limit"),
        ({"hard_limit_s": 0}, "time_limit must be > 0"),
        ({"hard_limit_s": 95}, r"time_limit 95 s is not below the lease minus margin .* = 90 s"),
        ({"soft_limit_s": 30}, "soft_time_limit 30 s must be below time_limit 30 s"),
        ({"longest_wait_s": 500}, r"retry_backoff_max 500 s is longer than JOBS_MAX_DELAY"),
    ],
)
def test_task_limits(limits: dict[str, Any], message: str) -> None:
    values = {
        "longest_wait_s": 10.0,
        "hard_limit_s": 30.0,
        "soft_limit_s": 25.0,
        "delivery_timeout_s": 100.0,
        "delivery_timeout_name": "lease",
        "margin_s": 10.0,
        "max_delay_s": 400.0,
        **limits,
    }
    with pytest.raises(ConfigError, match=message):
        rules.check_task_limits("t", **values)


def test_a_broker_that_never_redelivers_a_running_job_bounds_no_hard_limit() -> None:
    # The Redis broker with worker leases: the visibility timeout is only a backstop.
    rules.check_task_limits(
        "t",
        longest_wait_s=10.0,
        hard_limit_s=86400.0,
        soft_limit_s=None,
        delivery_timeout_s=None,
        delivery_timeout_name="visibility timeout",
        margin_s=60.0,
        max_delay_s=400.0,
    )
    with pytest.raises(ConfigError, match=r"no hard time limit: set time_limit \(seconds\)$"):
        rules.check_task_limits(
            "t",
            longest_wait_s=10.0,
            hard_limit_s=None,
            soft_limit_s=None,
            delivery_timeout_s=None,
            delivery_timeout_name="visibility timeout",
            margin_s=60.0,
            max_delay_s=400.0,
        )


@pytest.mark.parametrize(
    ("lease", "interval", "visibility", "message"),
    [
        (0.0, 5.0, 3600.0, "worker_lease must be > 0"),
        (15.0, 8.0, 3600.0, "at most half of worker_lease 15 s"),
        (15.0, 5.0, 20.0, r"worker_lease 15 s \+ unacked_restore_interval 5 s must be below"),
    ],
)
def test_the_worker_lease_fits_its_renewals_and_the_backstop(
    lease: float, interval: float, visibility: float, message: str
) -> None:
    rules.check_worker_lease(lease_s=15.0, restore_interval_s=5.0, visibility_s=3600.0)
    with pytest.raises(ConfigError, match=message):
        rules.check_worker_lease(
            lease_s=lease, restore_interval_s=interval, visibility_s=visibility
        )


def test_start_up_rules() -> None:
    rules.check_pool("prefork")
    with pytest.raises(ConfigError, match="'threads' pool does not enforce hard time limits"):
        rules.check_pool("threads")
    with pytest.raises(ConfigError, match="--prefetch-multiplier 4"):
        rules.check_prefetch(4)
    with pytest.raises(ConfigError, match=r"-Q/-X nope: no such queue; the queues are fast"):
        rules.check_queue_selection(["fast", "nope"], ["fast", "heavy"])


def test_dispatch_rules() -> None:
    with pytest.raises(DispatchError, match=r"t: unknown queue 'nope'"):
        rules.check_dispatch_queue("nope", task="t")

    class NamedQueue:
        name = "fast"

    rules.check_dispatch_queue(NamedQueue(), task="t")
    # Longer than the visibility timeout is fine (the delayed store holds it) ...
    rules.check_dispatch_delay("t", 3600, max_delay_s=86400)
    # ... longer than JOBS_MAX_DELAY is refused, pointing at beat.
    with pytest.raises(DispatchError, match=r"longer than JOBS_MAX_DELAY .*celery beat"):
        rules.check_dispatch_delay("t", 86401, max_delay_s=86400)
