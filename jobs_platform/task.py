"""ReliableTask: a ``celery.Task`` whose retry behaviour is pinned in code.

Subclass it (or pass ``base=ReliableTask``) and every exception from the task body is
classified (:mod:`jobs_platform.retry.classify`): permanent errors fail at once,
transient ones are re-published through the broker to the *same queue and priority*
after an equal-jitter backoff, with the attempt history in the message headers. After
``max_retries + 1`` attempts the original exception fails the task, exactly once.

Options use Celery's names where Celery has one (``max_retries``, ``retry_backoff``,
``retry_backoff_max``, ``retry_jitter``, ``time_limit``, ``soft_time_limit``), plus
``queue``, ``transient_errors``, ``permanent_errors``, ``retry_unknown_errors``,
``classifier``, ``business_key`` and ``unique_for`` (:mod:`jobs_platform.idempotency`),
``version`` and ``upcast`` (:mod:`jobs_platform.versions`).
When the task is declared they are resolved into its :class:`~jobs_platform.spec.TaskSpec`
(validated by :mod:`jobs_platform.rules`), which is all the class reads afterwards.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, ClassVar

import celery
from celery.exceptions import Ignore, Reject
from celery.exceptions import Retry as CeleryRetry
from kombu.exceptions import EncodeError

from jobs_platform import (
    brokers,
    bulk,
    cheap_retry,
    checkpoints,
    coordination,
    dispatch,
    history,
    rules,
    signature_check,
    versions,
)
from jobs_platform.clock import utc_iso, utcnow
from jobs_platform.errors import ConfigError, DispatchError, PermanentError
from jobs_platform.flow import task as flow_task
from jobs_platform.idempotency import unique
from jobs_platform.profiles import PROFILES
from jobs_platform.ratelimit import DEFERRED, limiter_for
from jobs_platform.retry import classify
from jobs_platform.retry.backoff import UniformRng
from jobs_platform.retry.policy import RetryPolicy
from jobs_platform.spec import OPTIONS, GiveUp, RetryIn, TaskSpec, resolve

logger = logging.getLogger("jobs_platform.task")

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

    # The options and their defaults, for readers: what a task declares is resolved into
    # ``spec`` at bind time (only values declared by a subclass count: see _declared()).
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
    #: Celery's "expected" errors: logged at INFO without a traceback ("raised expected"),
    #: not at ERROR as "raised unexpected". A PermanentError is the task's own verdict; its
    #: dead letter keeps the error and the traceback.
    throws: ClassVar[tuple[type[BaseException], ...]] = (PermanentError,)
    #: Argument names that identify the logical job (e.g. ``("invoice_id",)``); they give
    #: ``idempotency_key`` and the unique-dispatch lock (:mod:`jobs_platform.idempotency.unique`).
    business_key: ClassVar[Any] = ()
    #: Seconds: while such a job is queued or running, dispatching it again returns its id.
    unique_for: ClassVar[float | None] = None

    acks_late = True
    reject_on_worker_lost = True
    retry_on_worker_lost = True
    typing = True  # wrong arguments fail at dispatch, not in the worker

    #: The resolved declaration (set when the task is bound to its app).
    spec: ClassVar[TaskSpec]

    # -- declaration ---------------------------------------------------------------------------

    @classmethod
    def bind(cls, app: Any) -> Any:
        # Celery deprecates a `queue` class attribute in favour of task_routes: the declared
        # queue goes into the spec and the app's routing table instead.
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
    def _declared(cls) -> dict[str, Any]:
        """The options a subclass (not ReliableTask or Celery) declared, nearest first.

        Each class's own declaration is kept as it was written (``_declaration``): binding
        sets the attributes Celery reads, and Celery binds every task again when the
        worker finalizes the app, so the second reading must not see our own writes.
        """
        names = (*OPTIONS, *rules.PINNED, *rules.REFUSED)
        if "_declaration" not in cls.__dict__:
            cls._declaration = {name: cls.__dict__[name] for name in names if name in cls.__dict__}
        declared: dict[str, Any] = {}
        for klass in cls.__mro__:
            if klass is ReliableTask:
                break
            own = klass.__dict__.get("_declaration", klass.__dict__)
            for name in names:
                if name in own and name not in declared:
                    declared[name] = own[name]
        if getattr(cls, "_declared_queue", None) is not None:
            declared.setdefault("queue", cls._declared_queue)
        for name in ("classifier", "concurrency_key", "debounce_key", "fairness_key"):
            if isinstance(declared.get(name), staticmethod):
                declared[name] = declared[name].__func__
        return declared

    @classmethod
    def _configure(cls, app: Any) -> None:
        settings = getattr(app, "jobs_settings", None)
        if settings is None:
            raise ConfigError(
                f"task {cls.name!r} uses ReliableTask on an app not made by "
                "jobs_platform.create_app(); the reliability settings would not be pinned"
            )
        rules.check_declared_attribute_names(
            vars(cls), task=cls.name, known=TASK_OPTIONS, options=OPTIONS
        )
        declared = cls._declared()
        spec = resolve(
            cls.name,
            declared,
            settings=settings,
            routed_queue=app.jobs_router.queue_for(cls.name),
            run=cls.run,
        )
        app.jobs_router.declare(cls.name, spec.queue)
        cls.spec = spec
        for attr, value in spec.celery_attributes().items():
            setattr(cls, attr, value)  # Celery's own interface: the worker reads these
        if "__header__" not in vars(cls):
            # Celery gives decorated tasks an argument checker but not class-based ones; without
            # it `X.delay(1, "t", 3)` is enqueued and only fails (dead-lettered) in the worker.
            cls.__header__ = staticmethod(
                _named_checker(cls.name, app.type_checker(cls.run, bound=True))
            )
        check = vars(cls)["__header__"].__func__
        if not hasattr(check, "jobs_check"):
            # A re-publish of a checked job skips it (signature_check.unchecked); the worker's
            # version screen binds the upcast arguments with the check itself.
            cls.__header__ = staticmethod(signature_check.skippable(check))

    @classmethod
    def bind_arguments(cls, *args: Any, **kwargs: Any) -> Any:
        """Bind ``args``/``kwargs`` to this task's signature; TypeError if they do not fit."""
        return cls.__header__.jobs_check(*args, **kwargs)

    @property
    def queue(self) -> str:
        """The queue this task is routed to (declared, or from ``JOBS_ROUTES``)."""
        return self.spec.queue

    @property
    def queue_class(self) -> str:
        return self.spec.queue

    @property
    def retry_policy(self) -> RetryPolicy:
        return self.spec.policy

    @property
    def idempotency_key(self) -> str:
        """The running job's stable key (same across retries, redeliveries and replays)."""
        if not self.spec.business_key:
            raise ConfigError(f"task {self.name!r}: declare business_key=(...) to get a key")
        return unique.identity_of(self, self.request.args, self.request.kwargs)

    # -- checkpoints (jobs_platform.checkpoints) -------------------------------------------------

    def checkpoint(self, data: Any) -> None:
        """Store ``data`` (small JSON: where this job is) as the running job's progress.

        :meth:`last_checkpoint` returns it on the job's next retry, redelivery or replay;
        the job's success deletes it. A value over ``JOBS_CHECKPOINT_MAX_BYTES`` or one JSON
        cannot carry raises :class:`~jobs_platform.checkpoints.CheckpointRefused` here.
        """
        request = self.request
        if request.called_directly or not request.id:
            checkpoints.encode(self.name, data, max_bytes=self._checkpoint_max_bytes())
            return  # a plain function call: no job to resume
        setattr(request, checkpoints.USED_ATTR, True)
        checkpoints.save(self.app, self.name, request.id, data)

    def last_checkpoint(self) -> Any:
        """The last value :meth:`checkpoint` stored for this job, else ``None`` (a first run).

        A replay of a dead letter starts from the checkpoint its letter kept.
        """
        request = self.request
        if request.called_directly or not request.id:
            return None
        setattr(request, checkpoints.USED_ATTR, True)
        value = checkpoints.load(self.app, request.id)
        if value is None:
            value = (request.headers or {}).get(checkpoints.HEADER)
        return value

    def _checkpoint_max_bytes(self) -> int:
        return int(self.app.jobs_settings.checkpoint_max_bytes)

    def _clear_checkpoint(self) -> None:
        """The job succeeded: its checkpoint goes (only a run that used one pays a call)."""
        request = self.request
        if not (
            getattr(request, checkpoints.USED_ATTR, False)
            or checkpoints.HEADER in (request.headers or {})
        ):
            return
        try:
            checkpoints.clear(self.app, request.id)
        except Exception as exc:
            # The job is done either way; the key expires with JOBS_CHECKPOINT_TTL.
            logger.warning(
                "%s[%s] succeeded but its checkpoint could not be deleted: %r",
                self.name,
                request.id,
                exc,
                extra={"event": "jobs.checkpoint.clear_failed", "task_name": self.name},
            )

    # -- dispatch ------------------------------------------------------------------------------

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        dispatch.check_options(self, options)
        dispatch.check_size(self, args, kwargs)
        options = dispatch.versioned(self, dispatch.stamped(options))
        if self.spec.concurrency is not None:
            flow_task.check_concurrency_key(self, args, kwargs)
        if self.spec.fairness_key is not None:
            options = flow_task.with_fairness_key(self, args, kwargs, options)
        try:
            if self.spec.debounce is not None:
                return flow_task.dispatch_debounced(self, args, kwargs, options)
            if self.spec.unique_for_s is not None:
                return unique.dispatch_once(self, args, kwargs, options, super().apply_async)
            return super().apply_async(args, kwargs, **options)
        except EncodeError as exc:
            raise dispatch.not_json(self, exc, args, kwargs) from exc
        except Exception as exc:
            if not dispatch.broker_down(brokers.of(self.app), exc):
                raise
            raise dispatch.broker_unreachable(self, exc) from exc

    def _republish(self, signature: Any) -> Any:
        """Publish ``signature`` of this task (a retry or a deferral of a job that was
        checked when it was first dispatched) without checking it again."""
        # As Signature.apply_async() with no arguments would, minus ReliableTask's checks.
        options = dispatch.stamped(dict(signature.options))
        with signature_check.unchecked():  # its arguments may be of another payload version
            return celery.Task.apply_async(self, signature.args, signature.kwargs, **options)

    def delay_many(self, calls: Iterable[Any]) -> list[Any]:
        """``[self.delay(*c) for c in calls]`` (a dict ``c`` is keyword arguments), checked
        first and published through one connection in pipelined chunks (jobs_platform.bulk).

        Every call is checked before anything is sent; a refused one raises
        :class:`~jobs_platform.bulk.BulkDispatchError` with its index. Returns the
        AsyncResults in order (a ``unique_for`` duplicate gets the queued job's).
        """
        self._check_bulk()
        return bulk.delay_many(self, calls)

    def apply_async_many(self, calls: Iterable[Any], **options: Any) -> list[Any]:
        """``[self.apply_async(args, kwargs, **options) for args, kwargs in calls]``, like
        :meth:`delay_many`. A call may also be a signature of this task (``self.s(...)``,
        ``.set(countdown=...)``): its own options win over ``options``."""
        self._check_bulk()
        return bulk.apply_async_many(self, calls, options)

    def delay_on_commit(self, session: Any, *args: Any, **kwargs: Any) -> Any:
        """``self.delay(*args, **kwargs)`` once ``session``'s transaction commits, and never
        if it rolls back (jobs_platform.outbox).

        Checked at the call as ``.delay()`` is; the job is a row written in the session's
        transaction (a rolled-back savepoint drops it), published by a worker's relay with
        the id of the AsyncResult returned now. ``session`` is a SQLAlchemy Session on the
        platform's database (``JOBS_DATABASE_URL``).
        """
        return self.apply_async_on_commit(session, args, kwargs)

    def apply_async_on_commit(
        self, session: Any, args: Any = None, kwargs: Any = None, **options: Any
    ) -> Any:
        """``self.apply_async(args, kwargs, **options)`` with the commit of ``session``, as
        :meth:`delay_on_commit`."""
        from jobs_platform.outbox import enqueue  # SQLAlchemy: only for callers who use it

        return enqueue.add(self, session, args, kwargs, options)

    def _check_bulk(self) -> None:
        if self.spec.debounce is not None:
            raise DispatchError(
                f"{self.name}: a debounced task is dispatched one call at a time (.delay()): "
                "each dispatch joins its key's window; nothing was enqueued"
            )

    # -- execution: decide (spec), then record a give-up or publish a retry ---------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.request.called_directly:
            return super().__call__(*args, **kwargs)
        if self.spec.debounce is not None:
            flow_task.end_debounce_trigger(self)  # a trigger publishes the run, then Ignore
        if history.BATCH_HEADER in (self.request.headers or {}):
            self._batch_call("before_body")  # a cancelled batch's member: Ignore
        # Before a slot or a rate start is taken: a deferred job holds neither.
        args, kwargs = self._screen_version(args, kwargs)
        if self.spec.concurrency is None:
            return self._attempt(*args, **kwargs)
        slot = flow_task.take_slot(self, args, kwargs)  # raises Ignore after deferring
        try:
            return self._attempt(*args, **kwargs)
        finally:
            flow_task.release_slot(self, slot)

    def _attempt(self, *args: Any, **kwargs: Any) -> Any:
        breaker = self.spec.breaker
        probe = breaker is not None and flow_task.pass_breaker(self)  # else Ignore, deferred
        if self.spec.rate_limited:
            self._take_rate_slot()  # raises Ignore after deferring the job
        try:
            result = super().__call__(*args, **kwargs)
            if history.BATCH_HEADER in (self.request.headers or {}):
                # Before the ack; a failed write fails this attempt (retried, counted once).
                self._batch_call("succeeded")
        except (CeleryRetry, Ignore, Reject):
            if probe:
                flow_task.end_probe(self)
            raise
        except Exception as exc:
            attempt = self.request.retries + 1
            step = self.spec.decide(exc, attempt)
            if breaker is not None:
                flow_task.breaker_failed(self, step, probe=probe)
            if isinstance(step, RetryIn):
                self._pause_on_too_many_requests(step)
                # Ends this attempt without frame copies (jobs_platform.cheap_retry);
                # `from None`: the error travels in the history, not chained to the Retry.
                raise self._publish_retry(exc, attempt, step) from None
            self._give_up(exc, attempt, step)
            raise
        if breaker is not None:
            flow_task.breaker_succeeded(self)
        self._clear_checkpoint()
        return result

    def _batch_call(self, what: str) -> None:
        from jobs_platform.batches import running  # SQLAlchemy: only in a batch member

        found = running.membership(self.request)
        if found is not None:
            getattr(running, what)(self, *found)

    @property
    def batch(self) -> Any:
        """The running member's batch (``self.batch.add([...])`` adds members), or ``None``
        for a job of no batch (jobs_platform.batches)."""
        if history.BATCH_HEADER not in (self.request.headers or {}):
            return None
        from jobs_platform.batches import running

        return running.member_batch(self)

    def _take_rate_slot(self) -> None:
        """Run now if the shared limit allows (or this job's reserved slot has come); else
        re-publish it (same id, same attempt) to come back at the slot it reserved, and free
        the pool slot at once."""
        spec = self.spec
        assert spec.rate_key is not None
        request = self.request
        headers = dict(request.headers or {})
        reserved = headers.get(history.RATE_SLOT_HEADER)
        grant = limiter_for(coordination.url_of(self.app.jobs_settings)).acquire(
            spec.rate_key, spec.rate, slot_ms=reserved if isinstance(reserved, int) else None
        )
        wait_s = grant.wait_s
        if wait_s <= 0:
            return
        if grant.slot_ms is None:
            headers.pop(history.RATE_SLOT_HEADER, None)  # paused: no slot is held
        else:
            headers[history.RATE_SLOT_HEADER] = grant.slot_ms
        self._defer(wait_s, headers=headers)
        DEFERRED.labels(spec.rate_key).inc()
        logger.info(
            "%s[%s] deferred %.3f s by the %s limit on %r",
            self.name,
            request.id,
            wait_s,
            spec.rate or "paused",
            spec.rate_key,
            extra={"event": "jobs.rate.deferred", "task_name": self.name},
        )
        raise Ignore()

    def _defer(self, wait_s: float, *, headers: dict[str, Any] | None = None) -> None:
        """Re-publish the running job to come back in ``wait_s`` (at most JOBS_MAX_DELAY):
        same id, same attempt count, same queue, so no attempt is burned; the caller then
        raises Ignore, which frees the pool slot at once. Rate limits and breakers wait so."""
        request = self.request
        wait_s = min(wait_s, float(self.app.jobs_settings.max_delay))
        # The copy is a new delivery: a lost attempt was counted by this one, and a
        # concurrency wait's generation was claimed by it (the copy would be dropped).
        kept = {
            k: v
            for k, v in ((request.headers or {}) if headers is None else headers).items()
            if k not in (history.LOST_WORKER_HEADER, history.CONCURRENCY_GEN_HEADER)
        }
        self._republish(
            self.signature_from_request(
                request, queue=self._queue_of(request), countdown=wait_s, headers=kept
            )
        )

    def _screen_version(self, args: Any, kwargs: Any) -> tuple[Any, Any]:
        """The arguments of this task's payload version (an older payload upcast); a newer
        payload is deferred (Ignore) until its window ends, then dead-lettered like one that
        does not fit the signature: ``version_skew``, no retry (jobs_platform.versions)."""
        request = self.request
        if request.is_eager:
            return args, kwargs  # run by the caller's own code: no other version can meet it
        now = utcnow()
        try:
            step = versions.screen(
                self.name,
                self.spec.versions,
                request.headers,
                args,
                kwargs,
                bind=self.bind_arguments,
                now_s=now.timestamp(),
                window_s=self.app.jobs_settings.version_skew_window,
                stamp=utc_iso(now),
            )
        except versions.VersionSkew as exc:
            self._give_up(exc, request.retries + 1, GiveUp("version_skew", str(exc)))
            raise
        if isinstance(step, versions.Run):
            return step.args, step.kwargs
        self._defer(step.wait_s, headers=step.headers)
        logger.info(
            "%s[%s] payload of version %d is newer than this worker's version %d: deferred "
            "%.1f s for an upgraded worker",
            self.name,
            request.id,
            step.payload_version,
            self.spec.versions.version,
            step.wait_s,
            extra={"event": "jobs.version.deferred", "task_name": self.name},
        )
        raise Ignore()

    def _pause_on_too_many_requests(self, step: RetryIn) -> None:
        """A 429 with Retry-After stops every worker's starts under this task's rate key."""
        key = self.spec.rate_key
        if key is None or step.status != 429:
            return
        if step.retry_after_s:
            limiter_for(coordination.url_of(self.app.jobs_settings)).pause(key, step.retry_after_s)

    def _give_up(self, exc: Exception, attempt: int, step: GiveUp) -> None:
        """Hand the failure, as raised, to the dead-letter receiver; Celery then fails the
        task once with the original exception."""
        history.note_final_failure(
            self.request,
            history.FinalFailure.of(exc, attempt, outcome=step.outcome, status=step.status),
        )
        logger.warning(
            "%s[%s] gave up (%s) on attempt %d: %s (%s)",
            self.name,
            self.request.id,
            step.outcome,
            attempt,
            step.reason,
            type(exc).__name__,
            extra={"event": f"jobs.task.{step.outcome}", "task_name": self.name},
        )

    def _publish_retry(
        self, exc: Exception, attempt: int, step: RetryIn
    ) -> cheap_retry.PublishedRetry:
        """Publish the next attempt and return the Retry that ends this one.

        What ``Task.retry`` does once ``spec.decide`` has allowed the retry: the same
        message options (task id, parent/root ids, links, time limits, ``retries + 1``), the
        queue it came from, its priority, the attempt history in its headers. The Retry is
        raised by the caller, outside any helper frame (see ``__call__``).
        """
        request = self.request
        headers = history.with_error(request.headers, history.describe(exc, attempt))
        signature = self.signature_from_request(
            request,
            countdown=step.delay_s,
            retries=request.retries + 1,
            queue=self._queue_of(request),
            # Explicit although Celery 5.7 copies it: autoretries have lost it before (#5654).
            priority=(request.delivery_info or {}).get("priority"),
            headers=headers,
        )
        if not request.is_eager:  # task.apply() re-runs the signature itself
            try:
                self._republish(signature)
            except Exception as publish_failed:
                # Not published. If the broker was unreachable, requeue the message (it comes
                # back when the broker does) instead of dropping it; any other publish error
                # would fail the same way again, so it is a rejection without requeue (as in
                # Celery's retry), which the dead-letter table records.
                requeue = dispatch.broker_down(brokers.of(self.app), publish_failed)
                raise Reject(publish_failed, requeue=requeue) from exc
        cheap_retry.install()  # the frames-free end of this attempt (see its module)
        return cheap_retry.PublishedRetry(
            exc=exc, when=step.delay_s, is_eager=request.is_eager, sig=signature
        )

    def _queue_of(self, request: Any) -> str:
        """The queue this delivery came from, so retries never drift to the default queue."""
        routing_key = (request.delivery_info or {}).get("routing_key")
        if routing_key in PROFILES:
            return str(routing_key)
        return self.spec.queue

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
    | OPTIONS
    | DECORATOR_OPTIONS
    | set(rules.REFUSED)  # refused later with a message of their own
)


def check_task_options(names: Any, *, task: str) -> None:
    """``@app.task(...)`` options no task reads are refused (see rules)."""
    rules.check_declared_option_names(names, task=task, known=TASK_OPTIONS)


def _named_checker(task: str, check: Any) -> Any:
    """``check`` (Celery's argument checker) with the task's name in its TypeError."""

    def check_arguments(*args: Any, **kwargs: Any) -> Any:
        try:
            return check(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{task}: {exc}") from None

    return check_arguments
