"""TaskSpec: a task's declaration resolved into one frozen, validated value (pure: no Celery).

A ``ReliableTask`` is declared with options (decorator keywords or class attributes, Celery's
names where Celery has one). :func:`resolve` turns what was declared, the settings table and
the queue's worker profile into a :class:`TaskSpec`, applying the declaration rules of
:mod:`jobs_platform.rules`; the Celery class then reads its spec and nothing else. What to do
with a failed attempt is decided here too (:meth:`TaskSpec.decide`), so the whole retry
behaviour of a task is unit-tested without a worker.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from jobs_platform import brokers, rules
from jobs_platform.errors import ConfigError
from jobs_platform.flow import options as flow
from jobs_platform.profiles import PROFILES
from jobs_platform.ratelimit import Rate, parse_rate
from jobs_platform.retry import classify
from jobs_platform.retry.backoff import UniformRng
from jobs_platform.retry.policy import RetryPolicy
from jobs_platform.routing import QUEUE_NAMES, check_queue
from jobs_platform.versions import Versions

if TYPE_CHECKING:
    from jobs_platform.settings import Settings

#: The options ReliableTask reads from a declaration (and their meaning in docs/task-options.md).
OPTIONS = frozenset(
    {
        "queue",
        "max_retries",
        "retry_backoff",
        "retry_backoff_max",
        "retry_jitter",
        "retry_unknown_errors",
        "transient_errors",
        "permanent_errors",
        "classifier",
        "rng",
        "business_key",
        "unique_for",
        "time_limit",
        "soft_time_limit",
        "rate_limit",
        "rate_key",
        "concurrency_key",
        "concurrency_limit",
        "debounce",
        "debounce_key",
        "debounce_max",
        "fairness_key",
        "version",
        "upcast",
        "breaker_threshold",
        "breaker_window",
        "breaker_cooldown",
    }
)
#: Declaring any of these gives the task's ``rate_key`` a circuit breaker.
BREAKER_OPTIONS = ("breaker_threshold", "breaker_window", "breaker_cooldown")


@dataclasses.dataclass(frozen=True)
class RetryIn:
    """Retry the job after ``delay_s`` seconds (``status``, ``retry_after_s``: what the
    error said, read once for this decision)."""

    delay_s: float
    reason: str
    status: int | None = None
    retry_after_s: float | None = None


@dataclasses.dataclass(frozen=True)
class GiveUp:
    """Fail the job for good; ``outcome`` is the dead-letter reason."""

    outcome: Literal["permanent", "exhausted", "version_skew"]
    reason: str
    status: int | None = None


Step = RetryIn | GiveUp


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """Everything the platform decides about one task, validated when it is declared."""

    name: str
    queue: str
    policy: RetryPolicy
    time_limit_s: float
    soft_time_limit_s: float
    retry_unknown_errors: bool
    transient_errors: tuple[type[BaseException], ...]
    permanent_errors: tuple[type[BaseException], ...]
    classifier: Callable[[BaseException, classify.Attempt], classify.Decision]
    business_key: tuple[str, ...] = ()
    unique_for_s: float | None = None
    rng: UniformRng | None = None
    #: A limit shared by every worker (``rate_limit="10/s"``), under ``rate_key``.
    rate: Rate | None = None
    #: The downstream the limit protects (default: the task's name); a 429 pauses it.
    rate_key: str | None = None
    #: At most ``limit`` jobs of one ``key(*args, **kwargs)`` run at once (jobs_platform.flow).
    concurrency: flow.Concurrency | None = None
    #: Dispatches of one key collapse into one run with the last arguments.
    debounce: flow.Debounce | None = None
    #: The key its jobs are taken round robin by on their queue (jobs_platform.flow).
    fairness_key: flow.KeyFunction | None = None
    #: The payload version and its upcasters (jobs_platform.versions).
    versions: Versions = dataclasses.field(default_factory=Versions)
    #: The circuit breaker of ``rate_key`` (jobs_platform.flow.breaker).
    breaker: flow.Breaker | None = None

    @property
    def rate_limited(self) -> bool:
        return self.rate is not None or self.rate_key is not None

    def counts_against_downstream(self, step: Step) -> bool:
        """Whether a failed attempt (decided as ``step``) counts against the breaker: a
        transient failure is the downstream's (down, timing out, 5xx), even on the last
        attempt; a permanent one (a 400, a validation error) is the job's own; a 429 is the
        downstream throttling, which the rate key's pause handles."""
        if self.breaker is None:
            return False
        if isinstance(step, GiveUp) and step.outcome == "permanent":
            return False
        return step.status != 429

    def decide(self, exc: BaseException, attempt: int) -> Step:
        """What to do after attempt number ``attempt`` (1-based) raised ``exc``: the one
        classification of this attempt (the steps carry what the error said)."""
        facts = classify.facts_of(exc)
        decision = self.classifier(
            exc,
            classify.Attempt(
                task_name=self.name,
                number=attempt,
                transient_errors=self.transient_errors,
                permanent_errors=self.permanent_errors,
                retry_unknown_errors=self.retry_unknown_errors,
                facts=facts,
            ),
        )
        if isinstance(decision, classify.Fail):
            return GiveUp("permanent", decision.reason, facts.status)
        if attempt > self.policy.max_retries:
            reason = f"{decision.reason}; no retries left after {attempt}"
            return GiveUp("exhausted", reason, facts.status)
        delay = self.policy.delay_for(attempt, retry_after_s=decision.retry_after_s, rng=self.rng)
        return RetryIn(delay, decision.reason, facts.status, facts.retry_after_s)

    def celery_attributes(self) -> dict[str, Any]:
        """The Task attributes Celery itself reads (the worker applies the time limits; the
        worker-lost retry reads ``max_retries`` and ``default_retry_delay``)."""
        return {
            "max_retries": self.policy.max_retries,
            "default_retry_delay": self.policy.backoff_s,
            "time_limit": self.time_limit_s,
            "soft_time_limit": self.soft_time_limit_s,
            # Celery's per-worker bucket would hold messages in the worker; ours is global.
            "rate_limit": None,
        }


def resolve(
    name: str,
    declared: Mapping[str, Any],
    *,
    settings: Settings,
    routed_queue: str | None,
    run: Callable[..., Any],
) -> TaskSpec:
    """The spec of task ``name`` from the options it ``declared`` (only those), the settings
    table's defaults and its queue's profile; raises ConfigError naming the task."""
    rules.check_declared_not_refused(declared, task=name)
    rules.check_declared_retries(declared, task=name)
    option = declared.get
    try:
        policy = RetryPolicy(
            max_retries=option("max_retries", settings.max_retries),
            backoff_s=option("retry_backoff", settings.retry_backoff),
            backoff_max_s=option("retry_backoff_max", settings.retry_backoff_max),
            jitter=bool(option("retry_jitter", settings.retry_jitter)),
        )
    except ConfigError as exc:
        raise ConfigError(f"task {name!r}: {exc}") from None
    queue = option("queue") or routed_queue
    if queue is None:
        raise ConfigError(
            f"task {name!r} has no queue: pass queue=... (one of {', '.join(QUEUE_NAMES)}) "
            "or add a route for it (JOBS_ROUTES)"
        )
    queue = check_queue(queue, what=f"task {name!r}")
    profile = PROFILES[queue]
    hard = option("time_limit")
    hard = profile.time_limit_s if hard is None else hard
    soft = option("soft_time_limit")
    soft = min(profile.soft_time_limit_s, hard * 0.9) if soft is None else soft
    delivery_broker = brokers.for_url(settings.broker_url)
    delivery = delivery_broker.delivery_timeout(settings)
    rules.check_task_limits(
        name,
        longest_wait_s=policy.longest_wait_s,
        hard_limit_s=hard,
        soft_limit_s=soft,
        delivery_timeout_s=delivery.seconds if delivery.bounds_running_jobs else None,
        delivery_timeout_name=delivery.name,
        margin_s=settings.visibility_margin,
        max_delay_s=settings.max_delay,
    )
    classifier = option("classifier", classify.default_classifier)
    rules.check_classifier(classifier, task=name)
    rate_key = _rate_key(name, option("rate_limit"), option("rate_key"))
    return TaskSpec(
        name=name,
        queue=queue,
        policy=policy,
        time_limit_s=float(hard),
        soft_time_limit_s=float(soft),
        retry_unknown_errors=bool(option("retry_unknown_errors", settings.retry_unknown_errors)),
        transient_errors=rules.check_exception_types(
            option("transient_errors", ()), task=name, attr="transient_errors"
        ),
        permanent_errors=rules.check_exception_types(
            option("permanent_errors", ()), task=name, attr="permanent_errors"
        ),
        classifier=classifier,
        business_key=rules.check_business_key(option("business_key", ()), run, task=name),
        unique_for_s=rules.check_unique_for(option("unique_for"), task=name),
        rng=option("rng"),
        rate=parse_rate(option("rate_limit"), task=name),
        rate_key=rate_key,
        concurrency=flow.concurrency(
            option("concurrency_key"), option("concurrency_limit"), task=name
        ),
        debounce=_debounce(name, declared),
        fairness_key=flow.fairness(
            option("fairness_key"), task=name, no_fair_queues=delivery_broker.no_fair_queues
        ),
        versions=_versions(name, declared),
        breaker=_breaker(name, declared, rate_key, max_delay_s=settings.max_delay),
    )


def _versions(name: str, declared: Mapping[str, Any]) -> Versions:
    version = rules.check_declared_version(declared.get("version", 1), task=name)
    return Versions(
        version, rules.check_declared_upcast(declared.get("upcast"), version=version, task=name)
    )


def _breaker(
    name: str, declared: Mapping[str, Any], rate_key: str | None, *, max_delay_s: float
) -> flow.Breaker | None:
    if not any(declared.get(option) is not None for option in BREAKER_OPTIONS):
        return None
    threshold = declared.get("breaker_threshold", flow.BREAKER_THRESHOLD)
    window = declared.get("breaker_window", flow.BREAKER_WINDOW_S)
    cooldown = declared.get("breaker_cooldown", flow.BREAKER_COOLDOWN_S)
    rules.check_breaker(
        threshold, window, cooldown, task=name, rate_key=rate_key, max_delay_s=max_delay_s
    )
    assert rate_key is not None
    return flow.Breaker(rate_key, threshold, float(window), float(cooldown))


def _debounce(name: str, declared: Mapping[str, Any]) -> flow.Debounce | None:
    value = flow.debounce(
        declared.get("debounce"),
        declared.get("debounce_key"),
        declared.get("debounce_max"),
        task=name,
    )
    if value is not None and declared.get("unique_for") is not None:
        raise ConfigError(
            f"task {name!r}: debounce and unique_for both decide what a second dispatch "
            "does; declare one of them"
        )
    return value


def _rate_key(name: str, rate_limit: Any, rate_key: Any) -> str | None:
    if rate_key is not None and (not isinstance(rate_key, str) or not rate_key.strip()):
        raise ConfigError(f"task {name!r}: rate_key names a downstream, got {rate_key!r}")
    if rate_key is None and rate_limit is not None:
        return name
    return rate_key
