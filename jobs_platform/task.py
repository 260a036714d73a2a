"""ReliableTask: a ``celery.Task`` whose retry behaviour is pinned in code.

Subclass it (or pass ``base=ReliableTask``) and every exception from the task body is
classified (:mod:`jobs_platform.retry.classify`): permanent errors fail at once,
transient ones are re-published through the broker to the *same queue and priority*
after an equal-jitter backoff, with the attempt history in the message headers. After
``max_retries + 1`` attempts the original exception fails the task, exactly once.

Options use Celery's names where Celery has one (``max_retries``, ``retry_backoff``,
``retry_backoff_max``, ``retry_jitter``, ``time_limit``, ``soft_time_limit``), plus
``queue``, ``transient_errors``, ``permanent_errors``, ``retry_unknown_errors``,
``classifier``, ``business_key`` and ``unique_for`` (:mod:`jobs_platform.idempotency`).
They are validated when the task is declared.
"""

from __future__ import annotations

import datetime as dt
import difflib
import inspect
import logging
from typing import Any, ClassVar

import celery
from celery.exceptions import Ignore, Reject
from celery.exceptions import Retry as CeleryRetry
from kombu.exceptions import EncodeError, OperationalError

from jobs_platform import history
from jobs_platform.clock import as_utc, utc_iso, utcnow
from jobs_platform.errors import ConfigError, DispatchError
from jobs_platform.idempotency import unique
from jobs_platform.invariants import check_delay, check_task_limits
from jobs_platform.profiles import PROFILES
from jobs_platform.retry import classify
from jobs_platform.retry.backoff import UniformRng
from jobs_platform.retry.policy import RetryPolicy
from jobs_platform.routing import QUEUE_NAMES, check_queue
from jobs_platform.urls import masked

logger = logging.getLogger("jobs_platform.task")

_MISSING: Any = object()
#: Attributes pinned for at-least-once delivery; declaring another value is refused.
_PINNED = {"acks_late": True, "reject_on_worker_lost": True, "retry_on_worker_lost": True}
#: Celery options that would bypass classification.
_REFUSED = ("autoretry_for", "dont_autoretry_for", "retry_kwargs")
#: Options ReliableTask adds to Celery's (a near miss of one of these is refused).
RELIABLE_OPTIONS = frozenset(
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
    }
)
#: Keyword arguments of ``@app.task`` that are not Task attributes.
DECORATOR_OPTIONS = frozenset(
    {
        "base",
        "bind",
        "name",
        "lazy",
        "shared",
        "filter",
        "pydantic",
        "pydantic_strict",
        "pydantic_context",
        "pydantic_dump_kwargs",
    }
)


class ReliableTask(celery.Task):  # type: ignore[misc]
    """Base class for tasks that must survive failure. See the module docstring."""

    # Placeholders until bind() fills them from the declaration or the settings table
    # (only values declared by a subclass count: see _declared()).
    #: Retries after the first attempt; default ``JOBS_MAX_RETRIES``. ``None`` (forever) is refused.
    max_retries: ClassVar[Any] = None
    #: First backoff window in seconds (doubles per retry); default ``JOBS_RETRY_BACKOFF``.
    retry_backoff: ClassVar[Any] = 0.0
    #: Cap on one wait in seconds; default ``JOBS_RETRY_BACKOFF_MAX``.
    retry_backoff_max: ClassVar[Any] = 0.0
    #: Equal jitter (wait uniform in [w/2, w]); default ``JOBS_RETRY_JITTER``.
    retry_jitter: ClassVar[Any] = True
    #: Retry errors no rule recognises; default ``JOBS_RETRY_UNKNOWN_ERRORS``.
    retry_unknown_errors: ClassVar[Any] = True
    #: Extra exception types to retry / to fail at once (checked before the built-in rules).
    transient_errors: ClassVar[tuple[type[BaseException], ...]] = ()
    permanent_errors: ClassVar[tuple[type[BaseException], ...]] = ()
    #: ``classifier(exc, attempt) -> Retry | Fail``; the only place retry decisions are made.
    classifier: ClassVar[Any] = staticmethod(classify.default_classifier)
    #: RNG for the jitter (inject a seeded one in tests).
    rng: ClassVar[UniformRng | None] = None
    #: Argument names that identify the logical job (e.g. ``("invoice_id",)``); they give
    #: ``idempotency_key`` and the unique-dispatch lock (:mod:`jobs_platform.idempotency.unique`).
    business_key: ClassVar[tuple[str, ...]] = ()
    #: Seconds: while such a job is queued or running, dispatching it again returns its id.
    unique_for: ClassVar[float | None] = None

    acks_late = True
    reject_on_worker_lost = True
    retry_on_worker_lost = True
    typing = True  # wrong arguments fail at dispatch, not in the worker

    # Resolved at bind time.
    retry_policy: ClassVar[RetryPolicy]
    queue_class: ClassVar[str]

    # -- declaration ---------------------------------------------------------------------------

    @classmethod
    def bind(cls, app: Any) -> Any:
        # Celery deprecates a `queue` class attribute in favour of task_routes, so we move the
        # declared queue into the app's routing table (data) before Celery looks at it.
        if cls is not ReliableTask and "queue" in cls.__dict__:
            cls._declared_queue = cls.__dict__["queue"]
            delattr(cls, "queue")
        bound = super().bind(app)
        if cls is not ReliableTask and cls.name:
            try:
                cls._configure(app)
            except Exception as exc:
                # Celery registered the task before binding it; a refused task must not stay
                # callable (and must not block a corrected re-declaration).
                if app._tasks.get(cls.name) is not None and type(app._tasks[cls.name]) is cls:
                    del app._tasks[cls.name]
                if isinstance(exc, ConfigError):
                    raise
                raise ConfigError(f"task {cls.name!r}: {exc}") from exc
        return bound

    @classmethod
    def _declared(cls, attr: str) -> Any:
        """The value a subclass (not ReliableTask or Celery) declared for ``attr``."""
        for klass in cls.__mro__:
            if klass is ReliableTask:
                return _MISSING
            if attr in klass.__dict__:
                return klass.__dict__[attr]
        return _MISSING

    @classmethod
    def _option(cls, attr: str, default: Any) -> Any:
        value = cls._declared(attr)
        return default if value is _MISSING else value

    @classmethod
    def _check_refused_and_pinned(cls) -> None:
        for attr in _REFUSED:
            if cls._declared(attr) not in (_MISSING, (), None, {}):
                raise ConfigError(
                    f"task {cls.name!r}: {attr} is not used with ReliableTask; every exception is "
                    "classified instead (use transient_errors / permanent_errors)"
                )
        for attr, pinned in _PINNED.items():
            if cls._declared(attr) not in (_MISSING, pinned):
                raise ConfigError(
                    f"task {cls.name!r}: {attr} is pinned to {pinned} by ReliableTask"
                )

    @classmethod
    def _resolve_policy(cls, settings: Any) -> RetryPolicy:
        max_retries = cls._option("max_retries", settings.max_retries)
        if max_retries is None:
            raise ConfigError(
                f"task {cls.name!r}: max_retries=None would retry forever; give a number"
            )
        for attr in ("retry_backoff", "retry_backoff_max"):
            if isinstance(cls._option(attr, 0), bool):
                raise ConfigError(f"task {cls.name!r}: {attr} is a number of seconds, not a bool")
        try:
            return RetryPolicy(
                max_retries=max_retries,
                backoff_s=cls._option("retry_backoff", settings.retry_backoff),
                backoff_max_s=cls._option("retry_backoff_max", settings.retry_backoff_max),
                jitter=bool(cls._option("retry_jitter", settings.retry_jitter)),
            )
        except ConfigError as exc:
            raise ConfigError(f"task {cls.name!r}: {exc}") from None

    @classmethod
    def _resolve_queue(cls, app: Any) -> str:
        queue = getattr(cls, "_declared_queue", None) or app.jobs_router.queue_for(cls.name)
        if queue is None:
            raise ConfigError(
                f"task {cls.name!r} has no queue: pass queue=... (one of fast, heavy, thirdparty) "
                "or add a route for it"
            )
        queue = check_queue(queue, what=f"task {cls.name!r}")
        app.jobs_router.declare(cls.name, queue)
        return queue

    @classmethod
    def _configure(cls, app: Any) -> None:
        settings = getattr(app, "jobs_settings", None)
        if settings is None:
            raise ConfigError(
                f"task {cls.name!r} uses ReliableTask on an app not made by "
                "jobs_platform.create_app(); the reliability settings would not be pinned"
            )
        cls._check_refused_and_pinned()
        cls._check_option_names()
        policy = cls._resolve_policy(settings)
        queue = cls._resolve_queue(app)

        profile = PROFILES[queue]
        hard = cls._option("time_limit", None)
        hard = profile.time_limit_s if hard is None else hard
        soft = cls._option("soft_time_limit", None)
        soft = min(profile.soft_time_limit_s, hard * 0.9) if soft is None else soft
        check_task_limits(
            cls.name,
            policy,
            hard_limit_s=hard,
            soft_limit_s=soft,
            visibility_timeout_s=settings.visibility_timeout,
            margin_s=settings.visibility_margin,
        )
        option = cls._option
        transient = _exception_types(cls.name, "transient_errors", option("transient_errors", ()))
        permanent = _exception_types(cls.name, "permanent_errors", option("permanent_errors", ()))
        classifier = option("classifier", classify.default_classifier)
        if not callable(classifier):
            raise ConfigError(f"task {cls.name!r}: classifier must be callable(exc, attempt)")

        cls.retry_policy = policy
        cls.queue_class = queue
        cls.max_retries = policy.max_retries
        cls.retry_backoff = policy.backoff_s
        cls.retry_backoff_max = policy.backoff_max_s
        cls.retry_jitter = policy.jitter
        cls.retry_unknown_errors = bool(
            option("retry_unknown_errors", settings.retry_unknown_errors)
        )
        cls.default_retry_delay = policy.backoff_s  # used by Celery's worker-lost retry
        cls.time_limit, cls.soft_time_limit = hard, soft
        cls.transient_errors, cls.permanent_errors = transient, permanent
        cls.classifier = staticmethod(classifier)
        cls.business_key, cls.unique_for = unique.check_declaration(
            cls.name, cls.run, option("business_key", ()), option("unique_for", None)
        )
        if "__header__" not in vars(cls):
            # Celery gives decorated tasks an argument checker but not class-based ones; without
            # it `X.delay(1, "t", 3)` is enqueued and only fails (dead-lettered) in the worker.
            cls.__header__ = staticmethod(
                _named_checker(cls.name, app.type_checker(cls.run, bound=True))
            )

    @classmethod
    def _check_option_names(cls) -> None:
        """Refuse class attributes that look like a misspelt option (``transient_error``)."""
        for attr, value in vars(cls).items():
            if attr.startswith("_") or callable(value) or attr in TASK_OPTIONS:
                continue
            hint = difflib.get_close_matches(attr, sorted(RELIABLE_OPTIONS), n=1, cutoff=0.8)
            if hint:
                raise ConfigError(
                    f"task {cls.name!r}: {attr!r} is not a task option; did you mean {hint[0]!r}?"
                )

    @property
    def queue(self) -> str:
        """The queue this task is routed to (declared, or from ``JOBS_ROUTES``)."""
        return self.queue_class

    @property
    def idempotency_key(self) -> str:
        """The running job's stable key (same across retries, redeliveries and replays)."""
        if not self.business_key:
            raise ConfigError(f"task {self.name!r}: declare business_key=(...) to get a key")
        return unique.identity_of(self, self.request.args, self.request.kwargs)

    # -- dispatch ------------------------------------------------------------------------------

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        if options.get("queue") is not None:
            queue = options["queue"]
            name = getattr(queue, "name", queue)  # a kombu Queue or its name
            if name not in QUEUE_NAMES:
                raise DispatchError(
                    f"{self.name}: unknown queue {name!r}; the known queues are "
                    f"{', '.join(QUEUE_NAMES)}"
                )
        delay_s = _delay_seconds(options.get("countdown"), options.get("eta"))
        if delay_s is not None:
            settings = self.app.jobs_settings
            check_delay(
                self.name,
                delay_s,
                hard_limit_s=self.time_limit,
                visibility_timeout_s=settings.visibility_timeout,
                margin_s=settings.visibility_margin,
            )
        headers = options.get("headers") or {}
        if history.ENQUEUED_HEADER not in headers:
            options["headers"] = {**headers, history.ENQUEUED_HEADER: utc_iso()}
        try:
            if self.unique_for is not None:
                return unique.dispatch_once(self, args, kwargs, options, super().apply_async)
            return super().apply_async(args, kwargs, **options)
        except EncodeError as exc:
            raise DispatchError(
                f"{self.name}: arguments must be JSON-serialisable ({exc}); pass IDs, not objects"
            ) from exc
        except Exception as exc:
            if not _caused_by_connection_error(exc):
                raise
            settings = self.app.jobs_settings
            raise DispatchError(
                f"{self.name}: the broker at {masked(settings.broker_url)} did not answer within "
                f"{settings.dispatch_timeout:g} s (JOBS_DISPATCH_TIMEOUT); nothing was enqueued: "
                f"{_root_message(exc)}"
            ) from exc

    # -- execution -----------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except (CeleryRetry, Ignore, Reject):
            raise
        except Exception as exc:
            if self.request.called_directly:
                raise
            self._after_failure(exc)  # raises Retry, or returns to re-raise exc
            raise

    def _after_failure(self, exc: Exception) -> None:
        request = self.request
        number = request.retries + 1
        decision = self.classifier(
            exc,
            classify.Attempt(
                task_name=self.name,
                number=number,
                transient_errors=self.transient_errors,
                permanent_errors=self.permanent_errors,
                retry_unknown_errors=self.retry_unknown_errors,
            ),
        )
        if isinstance(decision, classify.Fail):
            history.note_final_failure(
                request,
                history.describe(exc, number),
                status=classify.http_status(exc),
                outcome="permanent",
            )
            logger.warning(
                "%s[%s] failed permanently on attempt %d: %s (%s)",
                self.name,
                request.id,
                number,
                decision.reason,
                type(exc).__name__,
                extra={"event": "jobs.task.permanent", "task_name": self.name},
            )
            return
        if request.retries >= self.max_retries:
            history.note_final_failure(
                request,
                history.describe(exc, number),
                status=classify.http_status(exc),
                outcome="exhausted",
            )
            logger.warning(
                "%s[%s] gave up after %d attempts: %s",
                self.name,
                request.id,
                number,
                type(exc).__name__,
                extra={"event": "jobs.task.exhausted", "task_name": self.name},
            )
            return
        delay = self.retry_policy.delay_for(
            number, retry_after_s=decision.retry_after_s, rng=self.rng
        )
        headers = history.with_error(request.headers, history.describe(exc, number))
        # Explicit although Celery 5.7 copies it: autoretries have lost it before (#5654).
        priority = (request.delivery_info or {}).get("priority")
        try:
            raise self.retry(
                exc=exc,
                countdown=delay,
                queue=self._queue_of(request),
                priority=priority,
                headers=headers,
            )
        except Reject as publish_failed:
            # Celery rejects *without* requeue when the retry cannot be published. If the
            # broker was unreachable, requeue the message (it comes back when the broker does)
            # instead of dropping it; any other publish error would fail the same way again,
            # so it stays a rejection, which the dead-letter table records.
            if _caused_by_connection_error(publish_failed.reason):
                raise Reject(publish_failed.reason, requeue=True) from exc
            raise

    def _queue_of(self, request: Any) -> str:
        """The queue this delivery came from, so retries never drift to the default queue."""
        routing_key = (request.delivery_info or {}).get("routing_key")
        if routing_key in PROFILES:
            return str(routing_key)
        return self.queue_class

    def signature_from_request(
        self,
        request: Any = None,
        args: Any = None,
        kwargs: Any = None,
        queue: Any = None,
        **extra: Any,
    ) -> Any:
        request = self.request if request is None else request
        if "retries" in extra and "headers" not in extra:
            # Celery's retry_on_worker_lost path: record the lost attempt in the history too.
            extra["headers"] = history.with_error(
                request.headers,
                history.entry(
                    "billiard.exceptions.WorkerLostError", "worker lost", request.retries + 1
                ),
            )
        return super().signature_from_request(
            request, args, kwargs, queue=queue or self._queue_of(request), **extra
        )


#: Every name a task declaration may set: Celery's Task attributes, ours, the decorator's.
TASK_OPTIONS = frozenset(
    {name for name in dir(ReliableTask) if not name.startswith("_")}
    | RELIABLE_OPTIONS
    | DECORATOR_OPTIONS
    | set(_REFUSED)  # refused later with a message of their own
)


def check_task_options(names: Any, *, task: str) -> None:
    """Refuse ``@app.task(...)`` options that no task reads, with a "did you mean" hint.

    Celery turns every keyword into a class attribute, so ``transient_error=(X,)`` would be
    silently ignored and X never retried.
    """
    for name in names:
        if name in TASK_OPTIONS:
            continue
        hint = difflib.get_close_matches(name, sorted(TASK_OPTIONS), n=1, cutoff=0.6)
        suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
        raise ConfigError(f"task {task}: unknown option {name!r}{suggestion}")


def _named_checker(task: str, check: Any) -> Any:
    """``check`` (Celery's argument checker) with the task's name in its TypeError."""

    def check_arguments(*args: Any, **kwargs: Any) -> Any:
        try:
            return check(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{task}: {exc}") from None

    return check_arguments


def _is_connection_error(exc: object) -> bool:
    return isinstance(exc, ConnectionError | TimeoutError | OperationalError) or any(
        history.qualified_name(cls) in _BROKER_DOWN for cls in type(exc).__mro__
    )


_BROKER_DOWN = frozenset({"redis.exceptions.ConnectionError", "redis.exceptions.TimeoutError"})


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling (Celery wraps a
    refused connection in a RuntimeError about its result store)."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def _caused_by_connection_error(exc: BaseException) -> bool:
    return any(_is_connection_error(link) for link in _causes(exc))


def _root_message(exc: BaseException) -> str:
    return str(_causes(exc)[-1]).strip() or type(exc).__name__


def _delay_seconds(countdown: Any, eta: Any) -> float | None:
    """How far in the future a dispatch asks to run, from ``countdown`` or ``eta``."""
    if countdown is not None:
        return float(countdown)
    if eta is None:
        return None
    when: dt.datetime = dt.datetime.fromisoformat(eta) if isinstance(eta, str) else eta
    return max(0.0, (as_utc(when) - utcnow()).total_seconds())


def _exception_types(task: str, attr: str, value: Any) -> tuple[type[BaseException], ...]:
    items = value if isinstance(value, tuple | list) else (value,)
    for item in items:
        if not (inspect.isclass(item) and issubclass(item, BaseException)):
            raise ConfigError(f"task {task!r}: {attr} must hold exception classes, got {item!r}")
    return tuple(items)
