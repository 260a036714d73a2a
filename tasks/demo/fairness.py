"""The tour's tenant storm: one tenant's backlog of statements, then a small tenant's few,
on the heavy queue (``fairness_key``); the report shows where the small tenant's started.

On RabbitMQ ``fairness_key`` is refused at declaration (tasks/tenants.py declares the task
without it there): the same storm runs in the order it was sent, and the report shows the
refusal with its reason, and where the small tenant's statements started without it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rich.console import Console

from jobs_platform.errors import ConfigError
from jobs_platform.flow.options import fairness
from jobs_platform.testing import wait_for
from tasks.tenants import NO_FAIR_QUEUES, build_statement, tenant_of

#: Statements of the big tenant (sent at once, delay_many) and then of the small one.
BIG = {"full": 200, "short": 60}
SMALL = 5
#: The small tenant's last statement must start before this share of the big one's.
FAIR_SHARE = 0.25


@dataclasses.dataclass
class Storm:
    big: list[str]
    small: list[str]
    #: "big" / "small" in the order the statements started (from their results).
    order: list[str] = dataclasses.field(default_factory=list)


def storm(workload: str, say: Any) -> Storm:
    """Send the storm and wait for every statement to end."""
    big = build_statement.delay_many([("big", n) for n in range(BIG[workload])])
    small = [build_statement.delay("small", n) for n in range(SMALL)]
    say(f"tenant storm: {len(big)} statements of tenant big, then {SMALL} of tenant small")
    run = Storm([r.id for r in big], [r.id for r in small])
    results = [*big, *small]
    wait_for(lambda: all(r.ready() for r in results), timeout_s=120, interval_s=0.5)
    started = [r.result for r in results if isinstance(r.result, dict)]
    run.order = [s["tenant"] for s in sorted(started, key=lambda s: s["started"])]
    return run


def big_before_small(run: Storm) -> int | None:
    """How many of big's statements had started when small's last one did."""
    if "small" not in run.order or run.order.count("small") < len(run.small):
        return None
    last = max(i for i, tenant in enumerate(run.order) if tenant == "small")
    return run.order[:last].count("big")


def report(console: Console, run: Storm | None, expect: Any) -> None:
    """The report's section: where the small tenant's statements started."""
    if run is None:
        return
    before = big_before_small(run)
    bound = int(len(run.big) * FAIR_SHARE)
    strip = "".join("s" if tenant == "small" else "." for tenant in run.order[:40])
    console.print(
        f"Tenant big sent {len(run.big)} statements at once, then tenant small {len(run.small)} "
        f"(heavy queue, fairness_key=tenant). The first 40 starts ('.' big, 's' small): {strip}"
    )
    console.print(
        "Without fairness the small tenant would wait for the whole backlog; the worker takes "
        f"one statement of each tenant with work in turn, so all of small's started after "
        f"{before if before is not None else '?'} of big's."
    )
    expect(
        "a small tenant's jobs start long before a big tenant's backlog drains",
        before is not None and before <= bound,
        f"all {len(run.small)} of small's started after {before} of big's {len(run.big)} "
        f"(bound {bound})",
    )


def refusal(no_fair_queues: str | None = NO_FAIR_QUEUES) -> str | None:
    """What declaring ``fairness_key`` on this app's broker says (None: it is accepted)."""
    try:
        fairness(tenant_of, task=build_statement.name, no_fair_queues=no_fair_queues)
    except ConfigError as exc:
        return str(exc)
    return None


def report_fifo(
    console: Console, run: Storm, expect: Any, no_fair_queues: str | None = NO_FAIR_QUEUES
) -> None:
    """The section on a broker without fair queues: the refusal, and the storm in order."""
    refused = refusal(no_fair_queues)
    before = big_before_small(run)
    strip = "".join("s" if tenant == "small" else "." for tenant in run.order[-40:])
    console.print(
        "Fairness between tenants takes a queue's jobs round robin across keys, which the "
        "Redis broker does and RabbitMQ does not. Declaring the task with fairness_key here "
        f"is refused at once:\n  [italic]{refused}[/]\nso the app declares it without "
        "(tasks/tenants.py: fairness_key only where the broker offers fair queues)."
    )
    console.print(
        f"Tenant big sent {len(run.big)} statements at once, then tenant small "
        f"{len(run.small)}, on the heavy queue, served in the order sent. The last 40 starts "
        f"('.' big, 's' small): {strip}"
    )
    console.print(
        f"Without fairness small's statements waited behind the backlog: all of them started "
        f"after {before if before is not None else '?'} of big's {len(run.big)} (on Redis, "
        f"with fairness_key, before {int(len(run.big) * FAIR_SHARE)}). On RabbitMQ, give a "
        "noisy tenant a queue of its own instead."
    )
    expect(
        "fairness_key refused on RabbitMQ at declaration, with its reason",
        refused is not None and "RabbitMQ" in refused,
        "ConfigError: " + (refused or "none")[:90] + ("..." if refused else ""),
    )
    expect(
        "every statement of the tenant storm ran",
        len(run.order) == len(run.big) + len(run.small),
        f"{len(run.order)} of {len(run.big) + len(run.small)} started and ended",
    )
