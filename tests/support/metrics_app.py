"""Tasks for the metrics acceptance test: successes, retries, failures, dead letters.

The worker reads ``JOBS_BROKER_URL`` / ``JOBS_DATABASE_URL`` from its environment; the
test process builds its own app on the same services with :func:`declare`, so the task
definitions exist once.
"""

from __future__ import annotations

from typing import Any

from jobs_platform import PermanentError, ReliableTask, TransientError, create_app

QUEUE = "fast"


def declare(app: Any) -> dict[str, Any]:
    """Declare the workload's tasks on ``app``; they are returned by short name."""

    @app.task(base=ReliableTask, name="metrics.ok", queue=QUEUE)
    def ok(n: int) -> int:
        return n

    @app.task(base=ReliableTask, bind=True, name="metrics.flaky", queue=QUEUE, max_retries=3)
    def flaky(self: Any, failures: int) -> str:
        # The attempt number travels with the message: no shared state needed.
        if self.request.retries < failures:
            raise TransientError(f"attempt {self.request.retries + 1} fails")
        return "ok"

    @app.task(base=ReliableTask, name="metrics.permanent", queue=QUEUE)
    def permanent(n: int) -> None:
        raise PermanentError(f"order {n} does not exist")

    @app.task(base=ReliableTask, name="metrics.exhausted", queue=QUEUE, max_retries=1)
    def exhausted(n: int) -> None:
        raise ConnectionError(f"partner refused connection #{n}")

    return {"ok": ok, "flaky": flaky, "permanent": permanent, "exhausted": exhausted}


app = create_app("metricsapp", retry_backoff=0.2, retry_backoff_max=0.4)
tasks = declare(app)


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Prometheus text parsed by prometheus-client's parser: (sample, labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(
    parsed: dict[tuple[str, frozenset[tuple[str, str]]], float], sample: str, /, **labels: str
) -> float | None:
    """One sample's value, ``None`` if it is not served."""
    return parsed.get((sample, frozenset(labels.items())))


def family_names(text: str) -> set[str]:
    from prometheus_client.parser import text_string_to_metric_families

    return {family.name for family in text_string_to_metric_families(text)}
