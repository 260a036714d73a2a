"""The one settings table: every knob with its type, default, unit and environment variable.

Precedence: ``create_app(**overrides)`` > environment (``JOBS_<NAME>``) > the default here.
Reliability settings that must not vary between workers (serialisation, acks, the
visibility timeout) are pinned in :mod:`jobs_platform.app`, not read from worker flags.
``markdown_table()`` renders this table for ``docs/settings.md`` (``docs/generate.py`` writes
it there; a unit test keeps them in step).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping
from typing import Any

from jobs_platform import brokers, events, rules
from jobs_platform.env import env_name
from jobs_platform.errors import ConfigError
from jobs_platform.payload import DEFAULT_MAX_BYTES
from jobs_platform.retry.policy import RetryPolicy

logger = logging.getLogger("jobs_platform.settings")


def _knob(default: Any, unit: str, doc: str) -> Any:
    factory = (lambda: dict(default)) if isinstance(default, dict) else None
    meta = {"unit": unit, "doc": doc}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True)
class Settings:
    broker_url: str = _knob(
        "redis://127.0.0.1:6379/0",
        "URL",
        "Celery broker: `redis://` or `rediss://` `[user:password@]host[:port][/db]`; or "
        "RabbitMQ, `amqp://` or `amqps://` `[user:password@]host[:port][/vhost]` (one vhost "
        "per app and environment: names are not prefixed; a cluster's nodes as Celery's "
        "`;`-separated list), which needs JOBS_COORDINATION_URL.",
    )
    coordination_url: str = _knob(
        "",
        "URL",
        "Redis for coordination: unique-dispatch locks, rate limits, beat's leader lock and "
        "slot records, the dead-letter spool, metric sums, health canaries. Empty means "
        "the broker URL (while the broker is Redis); required with a RabbitMQ broker.",
    )
    dispatch_timeout: float = _knob(
        5.0,
        "s",
        "How long `.delay()` waits for an unreachable broker before raising DispatchError.",
    )
    result_backend: str = _knob(
        "",
        "URL",
        "Result backend; empty means the broker URL on Redis, and the coordination Redis "
        "(JOBS_COORDINATION_URL) on RabbitMQ.",
    )
    database_url: str = _knob(
        "sqlite:///jobs_platform.sqlite3",
        "URL",
        "Platform tables (dead letters, idempotency keys); SQLite file by default, "
        "PostgreSQL in production.",
    )
    visibility_timeout: float = _knob(
        3600.0,
        "s",
        "Unacknowledged messages return to the queue after this long if no worker lease "
        "brought them back first (the backstop). Delayed waits stay below it minus the margin.",
    )
    visibility_margin: float = _knob(
        60.0,
        "s",
        "Safety margin kept below the visibility timeout.",
    )
    worker_lease: float = _knob(
        15.0,
        "s",
        "A worker's liveness lease, renewed every restore interval by its consuming loop: "
        "when it runs out (the worker died, its loop is stuck), any live worker puts the "
        "jobs it held back on their queues. The visibility timeout is only the backstop.",
    )
    unacked_restore_interval: float = _knob(
        5.0,
        "s",
        "How often a worker sweeps for expired unacknowledged messages "
        "(kombu's default is effectively ~100 s).",
    )
    delivery_limit: int = _knob(
        10,
        "count",
        "RabbitMQ: how many times the broker hands out one message before dead-lettering it "
        "(`x-delivery-limit` on every queue): the cap on a job that keeps killing its worker. "
        "Set by the platform so RabbitMQ 3.10 (no limit) and 4.x (20) behave the same.",
    )
    rabbitmq_consumer_timeout: float = _knob(
        1800.0,
        "s",
        "RabbitMQ: the server's `consumer_timeout` (30 min by default): a job held "
        "unacknowledged longer is redelivered while it still runs, so every hard time limit "
        "must end before it minus JOBS_VISIBILITY_MARGIN. Say here what the server has; raise "
        "it in rabbitmq.conf (`consumer_timeout = 7200000`, in ms).",
    )
    rabbitmq_startup_wait: float = _knob(
        60.0,
        "s",
        "RabbitMQ: how long a starting worker waits for the broker to answer before it gives "
        "up (it declares and checks its queues first).",
    )
    max_retries: int = _knob(5, "count", "Default retries after the first attempt.")
    retry_backoff: float = _knob(2.0, "s", "Default first backoff window (doubles per retry).")
    retry_backoff_max: float = _knob(300.0, "s", "Default cap on one backoff wait.")
    retry_jitter: bool = _knob(True, "bool", "Equal jitter: wait uniform in [w/2, w].")
    retry_unknown_errors: bool = _knob(
        True,
        "bool",
        "Retry exceptions the classifier does not recognise (bounded by max_retries).",
    )
    routes: dict[str, str] = _knob(  # noqa: RUF009 (_knob returns a dataclass field)
        {"celery.*": "fast"},
        "JSON",
        "Task-name glob -> queue. A task's own `queue` option wins over this table.",
    )
    default_queue: str = _knob(
        "fast", "queue", "Queue for plain (non-Reliable) tasks with no route."
    )
    task_events: str = _knob(
        "auto",
        "auto/on/off",
        "Task events, from which Flower shows tasks. `auto`: a worker sends them only while "
        "a monitor asks for them (Flower broadcasts `enable_events` every 5 s) and stops "
        "`JOBS_TASK_EVENTS_LEASE` s after the last request; `on`: always; `off`: never "
        "(Flower lists the workers but no task). `true`/`1` mean on, `false`/`0` off. They "
        "cost ~0.8 ms of worker CPU per task (docs/benchmarks.md).",
    )
    task_events_lease: float = _knob(
        15.0,
        "s",
        "In `auto` mode, how long task events stay on after a monitor's last `enable_events`; "
        "keep it longer than the monitor's interval (Flower: 5 s).",
    )
    result_expires: float = _knob(86400.0, "s", "How long task results are kept.")
    auto_migrate: bool = _knob(
        True,
        "bool",
        "A worker applies the platform's migrations at start "
        "(`celery -A APP db upgrade` does it by hand).",
    )
    dlq_redact_keys: str = _knob(
        "password,passwd,secret,token,api_key,authorization,card_number,cvv",
        "CSV",
        "Keys masked (recursively, case-insensitive) in dead-letter args, kwargs and headers.",
    )
    dlq_spool_key: str = _knob(
        "jobs:dlq:spool",
        "Redis key",
        "Broker list holding dead letters until the database has them.",
    )
    dlq_drain_interval: float = _knob(
        5.0,
        "s",
        "How often a worker moves spooled dead letters into the database.",
    )
    dlq_write_attempts: int = _knob(
        3,
        "count",
        "Attempts of one dead-letter database write before it stays spooled.",
    )
    dlq_webhook_url: str = _knob(
        "",
        "URL",
        "POST a JSON summary of new dead letters here (empty: no webhook).",
    )
    dlq_webhook_interval: float = _knob(
        10.0,
        "s",
        "Webhook aggregation window: at most one POST per window per process.",
    )
    idempotency_key_ttl: float = _knob(
        7 * 86400.0,
        "s",
        "How long a recorded idempotency key (and its result) is kept; "
        "after it a repeat of that side effect counts as new.",
    )

    max_delay: float = _knob(
        30 * 86400.0,
        "s",
        "Longest countdown/ETA (and retry wait) accepted; a longer one is refused at "
        "dispatch with DispatchError.",
    )
    max_payload_bytes: int = _knob(
        DEFAULT_MAX_BYTES,
        "bytes",
        "Largest JSON of a job's arguments (`[args, kwargs]`): a larger one is refused at "
        "dispatch with DispatchError, and one that reaches a queue anyway becomes a `poison` "
        "dead letter instead of running.",
    )
    checkpoint_max_bytes: int = _knob(
        16384,
        "bytes",
        "Largest JSON of one `self.checkpoint(data)` value: a larger one raises "
        "CheckpointRefused (a PermanentError) at the call.",
    )
    checkpoint_ttl: float = _knob(
        32 * 86400.0,
        "s",
        "How long a job's checkpoint is kept on the coordination Redis after its last read or "
        "write; longer than JOBS_MAX_DELAY (a retry's longest wait) plus the visibility "
        "timeout, so a waiting retry finds it. A dead letter keeps its own copy.",
    )
    delayed_key_prefix: str = _knob(
        "jobs:delayed",
        "Redis key",
        "Prefix of the durable delayed store's keys on the broker.",
    )
    delayed_release_interval: float = _knob(
        0.25,
        "s",
        "How often each worker's releaser moves due delayed jobs onto their queues "
        "(bounds lateness).",
    )
    outbox_relay_interval: float = _knob(
        0.2,
        "s",
        "How often each worker's relay looks for committed `delay_on_commit` jobs to "
        "publish (bounds the delay after a commit; full batches go out back to back).",
    )
    outbox_relay_batch: int = _knob(
        500,
        "jobs",
        "Outbox rows one relay pass claims and publishes in one database transaction.",
    )
    outbox_retention: float = _knob(
        86400.0,
        "s",
        "How long a published outbox row is kept before the maintenance schedule prunes it.",
    )
    batch_retention: float = _knob(
        604800.0,
        "s",
        "How long a settled batch (and its members' outcomes) is kept before the maintenance "
        "schedule prunes it; a dead member replayed after that is no longer counted.",
    )
    version_skew_window: float = _knob(
        900.0,
        "s",
        "How long a job whose payload version is newer than a worker's code is deferred "
        "(re-published, no attempt burned) waiting for an upgraded worker before it is "
        "dead-lettered `version_skew` (replay it after the deploy). Counted from the first "
        "deferral; keep it longer than a rolling deploy.",
    )
    beat_lock_timeout: float = _knob(
        5.0,
        "s",
        "Beat leader lock lifetime: a standby beat takes over at most this long after the "
        "leader dies.",
    )
    beat_loop_interval: float = _knob(
        1.0,
        "s",
        "Seconds between beat ticks (a slot is sent at most this late); at most a third "
        "of the lock timeout.",
    )
    beat_queue_wait: float = _knob(
        3600.0,
        "s",
        "How long a sent recurring run may wait in its queue before the overlap policy "
        "stops counting it as running.",
    )
    dlq_retention_days: float = _knob(
        30.0,
        "days",
        "The scheduled `dlq purge` removes replayed/discarded dead letters older than this.",
    )
    metrics_flush_interval: float = _knob(
        2.0,
        "s",
        "How often each process adds its metric counts to the totals in Redis.",
    )
    queue_objectives: dict[str, float] = _knob(  # noqa: RUF009 (_knob returns a dataclass field)
        {"fast": 60.0, "heavy": 900.0, "thirdparty": 300.0},
        "JSON",
        "Queue -> longest acceptable wait of its oldest job (s); `health` and the alert "
        "rules use it.",
    )
    flower_db: str = _knob(
        "flower.db",
        "path",
        "Flower's state file (persistent mode: tasks and workers survive a restart).",
    )
    flower_state_save_interval: float = _knob(
        60.0,
        "s",
        "How often Flower saves its state (0: only at shutdown).",
    )
    flower_basic_auth: str = _knob(
        "",
        "user:password",
        "Flower's basic auth (comma-separated for several users); FLOWER_BASIC_AUTH also works.",
    )
    flower_unsafe_no_auth: bool = _knob(
        False,
        "bool",
        "Allow Flower to start with no authentication (refused otherwise).",
    )
    cli_traceback: bool = _knob(
        False,
        "bool",
        "Show the traceback of a ConfigError/DispatchError at the `celery` command line (read "
        "from the environment before the app loads); off: one short message.",
    )

    def __post_init__(self) -> None:
        # Frozen: the mode is normalised in place (a bool or `0`/`true` -> its mode name).
        object.__setattr__(self, "task_events", events.parse_mode(self.task_events))
        if not self.task_events_lease > 0:
            raise ConfigError(f"task_events_lease must be > 0 s, got {self.task_events_lease!r}")
        rules.check_settings(vars(self))
        brokers.check_urls(vars(self))  # each broker knows the shape of its own URLs

    def default_policy(self) -> RetryPolicy:
        return RetryPolicy(
            max_retries=self.max_retries,
            backoff_s=self.retry_backoff,
            backoff_max_s=self.retry_backoff_max,
            jitter=self.retry_jitter,
        )

    @property
    def result_backend_url(self) -> str:
        return self.result_backend or brokers.default_result_backend(
            self.broker_url, self.coordination_url
        )

    @classmethod
    def load(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Build settings from ``overrides`` > ``JOBS_*`` environment > defaults."""
        environ = os.environ if environ is None else environ
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - set(known))
        if unknown:
            raise ConfigError(f"unknown setting(s) {unknown}; known: {sorted(known)}")
        _warn_near_misses(environ, known)
        values: dict[str, Any] = {}
        for name, field in known.items():
            if name in overrides:
                values[name] = overrides[name]
            elif env_name(name) in environ:
                values[name] = _parse(field, environ[env_name(name)])
        return cls(**values)


def _warn_near_misses(environ: Mapping[str, str], known: Mapping[str, object]) -> None:
    for variable, setting in rules.unknown_env_hints(environ, [env_name(k) for k in known]).items():
        logger.warning(
            "%s is not a jobs-platform setting and is ignored; did you mean %s?",
            variable,
            setting,
            extra={"event": "jobs.settings.unknown_env"},
        )


def _parse(field: dataclasses.Field[Any], raw: str) -> Any:
    kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", "")
    try:
        if kind == "bool":
            lowered = raw.strip().lower()
            if lowered not in {"1", "0", "true", "false", "yes", "no", "on", "off"}:
                raise ValueError(raw)
            return lowered in {"1", "true", "yes", "on"}
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind.startswith("dict"):
            value = json.loads(raw)
            if not isinstance(value, dict):
                raise ValueError("expected a JSON object")
            return value
    except ValueError as exc:
        raise ConfigError(f"{env_name(field.name)}={raw!r} is not a valid {kind}: {exc}") from exc
    return raw


def markdown_table() -> str:
    """The settings table as Markdown, for ``docs/settings.md``."""
    rows = ["| Setting (env) | Type | Default | Unit | Meaning |", "|---|---|---|---|---|"]
    for field in dataclasses.fields(Settings):
        default = getattr(Settings(), field.name)
        if isinstance(default, dict):
            shown = f"`{json.dumps(default)}`"
        else:
            shown = f"`{default}`" if default != "" else "(empty)"
        rows.append(
            f"| `{env_name(field.name)}` | {field.type} | {shown} | "
            f"{field.metadata['unit']} | {field.metadata['doc'].replace('|', chr(92) + '|')} |"
        )
    return "\n".join(rows)
