"""Every "refuse this configuration" rule, one small function each (pure: no Celery).

A rule raises :class:`~jobs_platform.errors.ConfigError` (or
:class:`~jobs_platform.errors.DispatchError` at dispatch) with a message that names the
setting or option and says what to do. Rules are grouped by the phase that applies them:

=============  =====================================================  =======================
phase          applied by                                             rules
=============  =====================================================  =======================
settings       ``Settings`` when the table is loaded (create_app)     ``check_settings``
declaration    ``TaskSpec`` when a task is declared (import time)     ``check_declared_*``,
                                                                      ``check_task_limits``
start-up       the worker's start-up checks (:mod:`.startup`), the    ``check_pool``,
               app's finalize, beat's schedule                        ``check_prefetch``, ...
dispatch       ``ReliableTask.apply_async``                           ``check_dispatch_*``
=============  =====================================================  =======================

A new rule goes here, next to the others of its phase, with a unit test in
``tests/unit/test_rules.py``; the phase's entry point calls it.
"""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from jobs_platform import arguments
from jobs_platform.errors import ConfigError, DispatchError
from jobs_platform.routing import QUEUE_NAMES, check_queue

#: A ceiling on ``max_retries``: unbounded retries are how "a bug that retries forever" happens.
MAX_RETRIES_CEILING = 1000
#: Attributes pinned for at-least-once delivery; declaring another value is refused.
PINNED = {"acks_late": True, "reject_on_worker_lost": True, "retry_on_worker_lost": True}
#: Celery options that would bypass classification.
REFUSED = ("autoretry_for", "dont_autoretry_for", "retry_kwargs")
#: Pools that stop a task at its hard time limit. Prefork kills the child process. gevent
#: raises ``gevent.Timeout`` in the task (``celery/concurrency/gevent.py``, ``apply_timeout``)
#: where it yields; for code that never yields, the watchdog (:mod:`jobs_platform.cooperative`)
#: ends the worker. Threads and solo ignore hard limits; eventlet is not covered by the
#: watchdog.
LIMIT_ENFORCING_POOLS = frozenset({"prefork", "gevent"})


# -- shared ------------------------------------------------------------------------------------


def check_positive(value: float, *, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"{what} must be > 0 seconds, got {value!r}")


def check_positive_int(value: Any, *, what: str, unit: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{what} must be a whole number of {unit} > 0, got {value!r}")


def _did_you_mean(name: str, known: Iterable[str], cutoff: float) -> str | None:
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=cutoff)
    return close[0] if close else None


# -- settings ----------------------------------------------------------------------------------


def check_visibility(*, visibility_timeout_s: float, margin_s: float) -> None:
    if visibility_timeout_s <= 0:
        raise ConfigError(f"visibility_timeout must be > 0 seconds, got {visibility_timeout_s}")
    if not 0 <= margin_s < visibility_timeout_s:
        raise ConfigError(
            f"visibility_margin ({margin_s} s) must be >= 0 and below "
            f"visibility_timeout ({visibility_timeout_s} s)"
        )


def check_retry_policy(max_retries: Any, backoff_s: Any, backoff_max_s: Any) -> None:
    """The limits of a :class:`~jobs_platform.retry.policy.RetryPolicy`."""
    if isinstance(max_retries, bool) or not isinstance(max_retries, int):
        raise ConfigError(
            f"max_retries must be an int between 0 and {MAX_RETRIES_CEILING}, "
            f"got {max_retries!r} (None would mean 'retry forever', which is refused)"
        )
    if not 0 <= max_retries <= MAX_RETRIES_CEILING:
        raise ConfigError(
            f"max_retries must be between 0 and {MAX_RETRIES_CEILING}, got {max_retries}"
        )
    for name, value in (("backoff_s", backoff_s), ("backoff_max_s", backoff_max_s)):
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise ConfigError(f"{name} must be a finite number of seconds, got {value!r}")
        if value <= 0:
            raise ConfigError(f"{name} must be > 0 seconds, got {value!r}")
    if backoff_max_s < backoff_s:
        raise ConfigError(f"backoff_max_s ({backoff_max_s}) must be >= backoff_s ({backoff_s})")


def check_settings(values: Mapping[str, Any]) -> None:
    """Every rule the settings table must satisfy, given its values by setting name
    (``Settings.__post_init__`` calls this; the table is data to the rules)."""
    check_visibility(
        visibility_timeout_s=values["visibility_timeout"], margin_s=values["visibility_margin"]
    )
    for name in (
        "dispatch_timeout",
        "unacked_restore_interval",
        "result_expires",
        "dlq_drain_interval",
        "dlq_webhook_interval",
        "idempotency_key_ttl",
        "max_delay",
        "delayed_release_interval",
        "beat_lock_timeout",
        "beat_loop_interval",
        "beat_queue_wait",
        "metrics_flush_interval",
        "outbox_relay_interval",
        "outbox_retention",
        "batch_retention",
        "version_skew_window",
        "rabbitmq_startup_wait",
    ):
        check_positive(values[name], what=name)
    check_rabbitmq(
        delivery_limit=values["delivery_limit"],
        consumer_timeout_s=values["rabbitmq_consumer_timeout"],
        margin_s=values["visibility_margin"],
    )
    check_positive_int(values["outbox_relay_batch"], what="outbox_relay_batch", unit="jobs")
    if values["dlq_write_attempts"] < 1:
        raise ConfigError("dlq_write_attempts must be >= 1")
    check_positive_int(values["max_payload_bytes"], what="max_payload_bytes", unit="bytes")
    if values["beat_loop_interval"] > values["beat_lock_timeout"] / 3:
        # The leader extends its lock once per tick; a slower tick lets the lock lapse and a
        # standby take over while the leader still sends: a slot could go out twice.
        raise ConfigError(
            f"beat_loop_interval {values['beat_loop_interval']:g} s must be at most a third of "
            f"beat_lock_timeout {values['beat_lock_timeout']:g} s"
        )
    days = values["dlq_retention_days"]
    if isinstance(days, bool) or not days > 0:
        raise ConfigError(f"dlq_retention_days must be > 0 days, got {days!r}")
    if values["flower_state_save_interval"] < 0:
        raise ConfigError("flower_state_save_interval must be >= 0 (0: save only at shutdown)")
    if not values["delayed_key_prefix"]:
        raise ConfigError("delayed_key_prefix must not be empty")
    check_worker_lease(
        lease_s=values["worker_lease"],
        restore_interval_s=values["unacked_restore_interval"],
        visibility_s=values["visibility_timeout"],
    )
    check_queue_objectives(values["queue_objectives"])
    check_queue(values["default_queue"], what="default_queue")
    for pattern, queue in values["routes"].items():
        check_queue(queue, what=f"routes[{pattern!r}]")
    check_retry_policy(values["max_retries"], values["retry_backoff"], values["retry_backoff_max"])
    if values["retry_backoff_max"] > values["max_delay"]:
        raise ConfigError(
            f"retry_backoff_max {values['retry_backoff_max']:g} s is longer than max_delay "
            f"{values['max_delay']:g} s (JOBS_MAX_DELAY)"
        )
    check_checkpoints(
        max_bytes=values["checkpoint_max_bytes"],
        ttl_s=values["checkpoint_ttl"],
        max_delay_s=values["max_delay"],
        visibility_s=values["visibility_timeout"],
    )


def check_rabbitmq(*, delivery_limit: Any, consumer_timeout_s: Any, margin_s: float) -> None:
    """RabbitMQ's redelivery cap is a whole number of deliveries >= 1; the consumer timeout
    must leave room for a job after the margin (hard limits end before it minus the margin)."""
    check_positive_int(delivery_limit, what="delivery_limit", unit="deliveries")
    check_positive(consumer_timeout_s, what="rabbitmq_consumer_timeout")
    if consumer_timeout_s <= margin_s:
        raise ConfigError(
            f"rabbitmq_consumer_timeout {consumer_timeout_s:g} s must be longer than "
            f"visibility_margin {margin_s:g} s: hard time limits end before it minus the margin"
        )


def check_checkpoints(
    *, max_bytes: Any, ttl_s: Any, max_delay_s: float, visibility_s: float
) -> None:
    """A checkpoint must outlive a retry's longest wait and a lost job's redelivery."""
    check_positive_int(max_bytes, what="checkpoint_max_bytes", unit="bytes")
    check_positive(ttl_s, what="checkpoint_ttl")
    if ttl_s <= max_delay_s + visibility_s:
        raise ConfigError(
            f"checkpoint_ttl {ttl_s:g} s must be longer than max_delay {max_delay_s:g} s plus "
            f"visibility_timeout {visibility_s:g} s: a retry waiting that long, or a job "
            "redelivered after its worker died, would find its checkpoint gone"
        )


def check_queue_objectives(objectives: Mapping[str, Any]) -> None:
    """One objective (seconds > 0) for every queue, none for a queue that does not exist."""
    unknown = sorted(set(objectives) - set(QUEUE_NAMES))
    missing = [q for q in QUEUE_NAMES if q not in objectives]
    if unknown or missing:
        raise ConfigError(
            f"queue_objectives must give each queue ({', '.join(QUEUE_NAMES)}) its seconds; "
            f"unknown: {unknown or 'none'}, missing: {missing or 'none'}"
        )
    for queue, seconds in objectives.items():
        check_positive(seconds, what=f"queue_objectives[{queue!r}]")


def unknown_env_hints(environ: Iterable[str], known: Collection[str]) -> dict[str, str]:
    """``JOBS_*`` variables that are not settings but look like one -> the setting they
    resemble (a typo is otherwise silently ignored and the default applies)."""
    hints = {}
    for variable in environ:
        if variable.startswith("JOBS_") and variable not in known:
            hint = _did_you_mean(variable, known, cutoff=0.8)
            if hint:
                hints[variable] = hint
    return hints


# -- declaration -------------------------------------------------------------------------------


def check_declared_option_names(
    names: Iterable[str], *, task: str, known: Collection[str], cutoff: float = 0.6
) -> None:
    """Refuse ``@app.task(...)`` options no task reads, with a "did you mean" hint: Celery
    turns every keyword into a class attribute, so ``transient_error=(X,)`` would be silently
    ignored and X never retried."""
    for name in names:
        if name not in known:
            hint = _did_you_mean(name, known, cutoff)
            suggestion = f"; did you mean {hint!r}?" if hint else ""
            raise ConfigError(f"task {task}: unknown option {name!r}{suggestion}")


def check_declared_attribute_names(
    attributes: Mapping[str, Any], *, task: str, known: Collection[str], options: Collection[str]
) -> None:
    """Refuse class attributes that look like a misspelt option (``transient_error``); an
    app's own attributes and methods (anything not close to an option) are left alone."""
    for attr, value in attributes.items():
        if attr.startswith("_") or callable(value) or attr in known:
            continue
        hint = _did_you_mean(attr, options, cutoff=0.8)
        if hint:
            raise ConfigError(
                f"task {task!r}: {attr!r} is not a task option; did you mean {hint!r}?"
            )


def check_declared_not_refused(declared: Mapping[str, Any], *, task: str) -> None:
    for attr in REFUSED:
        if declared.get(attr) not in (None, (), {}):
            raise ConfigError(
                f"task {task!r}: {attr} is not used with ReliableTask; every exception is "
                "classified instead (use transient_errors / permanent_errors)"
            )
    for attr, pinned in PINNED.items():
        if attr in declared and declared[attr] != pinned:
            raise ConfigError(f"task {task!r}: {attr} is pinned to {pinned} by ReliableTask")


def check_declared_retries(declared: Mapping[str, Any], *, task: str) -> None:
    if "max_retries" in declared and declared["max_retries"] is None:
        raise ConfigError(f"task {task!r}: max_retries=None would retry forever; give a number")
    for attr in ("retry_backoff", "retry_backoff_max"):
        if isinstance(declared.get(attr), bool):
            raise ConfigError(f"task {task!r}: {attr} is a number of seconds, not a bool")


def check_exception_types(value: Any, *, task: str, attr: str) -> tuple[type[BaseException], ...]:
    items = value if isinstance(value, tuple | list) else (value,)
    for item in items:
        if not (inspect.isclass(item) and issubclass(item, BaseException)):
            raise ConfigError(f"task {task!r}: {attr} must hold exception classes, got {item!r}")
    return tuple(items)


def check_classifier(classifier: Any, *, task: str) -> None:
    if not callable(classifier):
        raise ConfigError(f"task {task!r}: classifier must be callable(exc, attempt)")


def check_business_key(business_key: Any, run: Callable[..., Any], *, task: str) -> tuple[str, ...]:
    """Each business-key name must be an argument of the task."""
    names = (business_key,) if isinstance(business_key, str) else tuple(business_key or ())
    params = inspect.signature(run).parameters
    accepts_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    for name in names:
        if not isinstance(name, str) or (name not in params and not accepts_any):
            raise ConfigError(
                f"task {task!r}: business_key {name!r} is not an argument of the task "
                f"(arguments: {', '.join(params)})"
            )
    return names


def check_unique_for(unique_for: Any, *, task: str) -> float | None:
    if unique_for is None:
        return None
    if isinstance(unique_for, bool) or not isinstance(unique_for, int | float) or unique_for <= 0:
        raise ConfigError(
            f"task {task!r}: unique_for is a number of seconds > 0, got {unique_for!r}"
        )
    return float(unique_for)


def check_declared_version(version: Any, *, task: str) -> int:
    """``version`` is the payload version of the task's code: a whole number >= 1."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ConfigError(
            f"task {task!r}: version is the payload's version, a whole number >= 1 "
            f"(default 1), got {version!r}"
        )
    return version


def check_declared_upcast(upcast: Any, *, version: int, task: str) -> dict[int, Any]:
    """``upcast`` maps every older version k (1 .. version-1) to a callable that turns its
    ``(args, kwargs)`` into version k+1's: no gap (a payload of the missing version could not
    be brought up), no key at or beyond ``version`` (nothing to upcast to)."""
    if upcast is None:
        upcast = {}
    if not isinstance(upcast, Mapping):
        raise ConfigError(
            f"task {task!r}: upcast is a dict {{k: f}} with f(args, kwargs) -> the (args, "
            f"kwargs) of version k+1, got {type(upcast).__name__}"
        )
    for key, function in upcast.items():
        if isinstance(key, bool) or not isinstance(key, int) or not 1 <= key < version:
            raise ConfigError(
                f"task {task!r}: upcast key {key!r} is not an older version: with version="
                f"{version} the keys are 1..{version - 1} (upcast[k] turns version k into k+1)"
            )
        if not callable(function):
            raise ConfigError(
                f"task {task!r}: upcast[{key}] must be callable(args, kwargs) -> (args, "
                f"kwargs), got {function!r}"
            )
    missing = [k for k in range(1, version) if k not in upcast]
    if missing:
        raise ConfigError(
            f"task {task!r}: version={version} needs upcast[k] for every older version k; "
            f"missing: {', '.join(map(str, missing))} (a queued payload of that version could "
            "not run)"
        )
    return dict(upcast)


def check_breaker(
    threshold: Any,
    window_s: Any,
    cooldown_s: Any,
    *,
    task: str,
    rate_key: str | None,
    max_delay_s: float,
) -> None:
    """The circuit-breaker options: whole failures >= 1, seconds > 0, a downstream to count
    them against (the ``rate_key``), and a cool-down no longer than JOBS_MAX_DELAY (a
    deferred job waits it out in one countdown)."""
    if rate_key is None:
        raise ConfigError(
            f"task {task!r}: the circuit breaker counts failures per downstream; name it with "
            "rate_key='partner-x' (the key rate limits use)"
        )
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
        raise ConfigError(
            f"task {task!r}: breaker_threshold is a whole number of failures >= 1, "
            f"got {threshold!r}"
        )
    for name, value in (("breaker_window", window_s), ("breaker_cooldown", cooldown_s)):
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value <= 0
        ):
            raise ConfigError(f"task {task!r}: {name} is a number of seconds > 0, got {value!r}")
    if cooldown_s > max_delay_s:
        raise ConfigError(
            f"task {task!r}: breaker_cooldown {cooldown_s:g} s is longer than JOBS_MAX_DELAY "
            f"({max_delay_s:g} s): a deferred job waits out the cool-down in one countdown"
        )


def check_task_limits(
    task: str,
    *,
    longest_wait_s: float,
    hard_limit_s: float | None,
    soft_limit_s: float | None,
    delivery_timeout_s: float | None,
    delivery_timeout_name: str,
    margin_s: float,
    max_delay_s: float,
) -> None:
    """A task needs a hard limit; where the broker gives a job held longer than its delivery
    timeout to another worker even while it runs (``delivery_timeout_s``; None: the broker
    never does while the worker lives, as the Redis broker with worker leases), the hard
    limit must end within it minus the margin, or the job runs twice. Its longest retry wait
    must fit in JOBS_MAX_DELAY; a wait may be hours (a long one waits in the broker's delayed
    store, not a worker's memory)."""
    budget = None if delivery_timeout_s is None else delivery_timeout_s - margin_s
    if hard_limit_s is None:
        where = (
            ""
            if budget is None
            else f" below {budget:g} s ({delivery_timeout_name} {delivery_timeout_s:g} s "
            f"minus margin {margin_s:g} s)"
        )
        raise ConfigError(f"task {task!r} has no hard time limit: set time_limit (seconds){where}")
    for label, value in (("time_limit", hard_limit_s), ("soft_time_limit", soft_limit_s)):
        if value is not None and value <= 0:
            raise ConfigError(f"task {task!r}: {label} must be > 0 seconds, got {value}")
    if budget is not None and hard_limit_s >= budget:
        raise ConfigError(
            f"task {task!r}: time_limit {hard_limit_s:g} s is not below the "
            f"{delivery_timeout_name} minus margin ({delivery_timeout_s:g} - {margin_s:g} = "
            f"{budget:g} s); a still-running task would be delivered to a second worker"
        )
    if soft_limit_s is not None and soft_limit_s >= hard_limit_s:
        raise ConfigError(
            f"task {task!r}: soft_time_limit {soft_limit_s:g} s must be below "
            f"time_limit {hard_limit_s:g} s"
        )
    if longest_wait_s > max_delay_s:
        raise ConfigError(
            f"task {task!r}: retry_backoff_max {longest_wait_s:g} s is longer than "
            f"JOBS_MAX_DELAY ({max_delay_s:g} s)"
        )


def check_worker_lease(*, lease_s: float, restore_interval_s: float, visibility_s: float) -> None:
    """The worker lease is renewed every restore interval, and the visibility timeout is
    only its backstop: the lease must outlast two renewals, and lease plus one sweep must
    end before the visibility timeout, or kombu's sweep would come first."""
    check_positive(lease_s, what="worker_lease")
    if restore_interval_s > lease_s / 2:
        raise ConfigError(
            f"unacked_restore_interval {restore_interval_s:g} s must be at most half of "
            f"worker_lease {lease_s:g} s: the lease is renewed once per restore interval"
        )
    if lease_s + restore_interval_s >= visibility_s:
        raise ConfigError(
            f"worker_lease {lease_s:g} s + unacked_restore_interval {restore_interval_s:g} s "
            f"must be below visibility_timeout {visibility_s:g} s: a dead worker's jobs come "
            "back when its lease runs out; the visibility timeout is only the backstop"
        )


# -- start-up ----------------------------------------------------------------------------------


def check_pool(pool: str) -> None:
    if pool not in LIMIT_ENFORCING_POOLS:
        raise ConfigError(
            f"the {pool!r} pool does not enforce hard time limits, so a hung task could "
            "outlive the visibility timeout and run twice; start the worker with "
            "-P prefork, or -P gevent for I/O-bound work "
            "(see `celery -A APP worker-profile QUEUE --print`)"
        )


def check_prefetch(prefetch_multiplier: int) -> None:
    if prefetch_multiplier != 1:
        raise ConfigError(
            f"--prefetch-multiplier {prefetch_multiplier}: with late acks a prefetched message "
            "waits unacknowledged behind a running task and can outlive the visibility "
            "timeout; jobs-platform pins it to 1"
        )


def check_queue_selection(named: Iterable[str], declared: Collection[str]) -> None:
    """``-Q``/``-X`` may only name declared queues (Celery's own message suggests enabling
    ``task_create_missing_queues``, which the platform pins off)."""
    unknown = [queue for queue in named if queue not in declared]
    if unknown:
        raise ConfigError(
            f"-Q/-X {', '.join(unknown)}: no such queue; the queues are {', '.join(declared)} "
            "(queues are declared by jobs-platform, never created on the fly)"
        )


def check_beat_entry_arguments(entry: str, args: Any, kwargs: Any) -> None:
    """A beat entry's arguments must be values a job's JSON carries (the dispatch rule,
    :mod:`jobs_platform.arguments`), checked when beat starts rather than at every tick."""
    found = arguments.unsendable(args, kwargs)
    if found is not None:
        raise ConfigError(
            f"beat entry {entry!r}: argument {found[0]} is {found[1]}, which a job's JSON "
            "cannot carry: pass JSON values (a list for a set, IDs for objects); datetime, "
            "date, time, Decimal, UUID and bytes arrive as their own type"
        )


# -- dispatch ----------------------------------------------------------------------------------


def check_dispatch_queue(queue: Any, *, task: str) -> None:
    """An explicit ``apply_async(queue=...)`` must name a declared queue (or a kombu Queue
    of one); kombu would raise ``QueueNotFound`` deep inside the publish."""
    name = getattr(queue, "name", queue)
    if name not in QUEUE_NAMES:
        raise DispatchError(
            f"{task}: unknown queue {name!r}; the known queues are {', '.join(QUEUE_NAMES)}"
        )


def check_dispatch_payload(task: str, size_bytes: int, *, max_bytes: int) -> None:
    """A job's arguments (the JSON of ``[args, kwargs]``) may be JOBS_MAX_PAYLOAD_BYTES; a
    larger message would sit in the broker's memory and be refused by the worker anyway."""
    if size_bytes > max_bytes:
        raise DispatchError(
            f"{task}: the arguments are {size_bytes} bytes of JSON, over JOBS_MAX_PAYLOAD_BYTES "
            f"({max_bytes} bytes); pass IDs and store large data elsewhere (a database row, "
            "an object store)"
        )


def check_dispatch_delay(task: str, delay_s: float, *, max_delay_s: float) -> None:
    """A dispatch-time delay (countdown/ETA) may be as long as JOBS_MAX_DELAY; a long one
    waits in the durable delayed store, not in a worker (jobs_platform.delayed)."""
    if delay_s > max_delay_s:
        raise DispatchError(
            f"{task}: a delay of {delay_s:g} s is longer than JOBS_MAX_DELAY "
            f"({max_delay_s:g} s); for work due further ahead, store the due date in your "
            "own table and enqueue it from a periodic task (celery beat)"
        )


# -- batches -------------------------------------------------------------------------------------


def check_batch_name(name: Any) -> str:
    """A batch's name is a non-empty string that fits its column (255 characters)."""
    if not isinstance(name, str) or not name.strip() or len(name) > 255:
        raise DispatchError(
            f"batch name must be a non-empty string of at most 255 characters, got {name!r}; "
            "nothing was enqueued"
        )
    return name


def check_batch_member(task: Any, *, index: int) -> None:
    """A member is a ReliableTask of an app made by create_app, and neither debounced nor
    ``unique_for``: a debounced dispatch runs later under another id, and a unique one may
    return a job already queued outside the batch; either would never be counted."""
    spec = getattr(task, "spec", None)
    name = getattr(task, "name", repr(task))
    if spec is None or getattr(task.app, "jobs_settings", None) is None:
        raise DispatchError(
            f"batch member {index} ({name}) is not a ReliableTask of a jobs_platform app: its "
            "outcome could not be counted; nothing was enqueued"
        )
    if spec.debounce is not None or spec.unique_for_s is not None:
        option = "debounce" if spec.debounce is not None else "unique_for"
        raise DispatchError(
            f"batch member {index} ({name}) declares {option}: such a dispatch may not run "
            "under the id it was given, so the batch could never count it; declare a task "
            "without it for batch members; nothing was enqueued"
        )


def check_batch_callback(which: str, callback: Any, *, allowed: Collection[str]) -> None:
    """A callback is a Celery signature whose options the outbox relay can send."""
    # A celery Signature is a dict with .task and .apply_async (pure: Celery not imported).
    is_signature = isinstance(callback, dict) and hasattr(callback, "apply_async")
    if not is_signature or not isinstance(getattr(callback, "task", None), str):
        raise DispatchError(
            f"batch {which} must be a signature of one task (task.s(...)), got "
            f"{type(callback).__name__}; nothing was enqueued"
        )
    unknown = sorted(set(callback.options or {}) - set(allowed))
    if unknown:
        raise DispatchError(
            f"batch {which} ({callback.task}): {', '.join(unknown)} cannot be sent by the outbox "
            f"relay (it sends only {', '.join(sorted(allowed))}); nothing was enqueued"
        )
