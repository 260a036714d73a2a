"""Idempotency: at-least-once delivery never repeats a side effect.

Three guards, from the strongest to a courtesy:

* :func:`transition`: a status compare-and-swap on the app's own row, committed before
  the side effect; duplicates return without running it.
* :class:`IdempotencyKeys`: the platform's key table, for side effects on services that
  cannot dedupe; a duplicate gets the recorded result back. Tasks also expose
  ``task.idempotency_key`` for services that honour an ``Idempotency-Key`` header.
* unique dispatch: ``unique_for=`` on a task; enqueue-time only.

::

    claim.py   the leased claim both database guards rest on: owners, leases, the
               conditional UPDATE/INSERT/DELETE                         (SQLAlchemy)
    cas.py     the status compare-and-swap: Transition, @transition    (SQLAlchemy)
    keys.py    IdempotencyKeys: claim / record / release / keep / run_once (SQLAlchemy)
    model.py   the idempotency_keys table                               (SQLAlchemy)
    unique.py  business keys, task.idempotency_key, unique dispatch     (Redis)
    events.py  duplicates logged and counted                            (pure)

The names below load on first use: ``jobs_platform.task`` imports only ``unique``, and a
producer that never touches the tables must not pay for SQLAlchemy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jobs_platform.idempotency.cas import Transition, claim_columns, transition
    from jobs_platform.idempotency.claim import Claim
    from jobs_platform.idempotency.keys import IdempotencyKeys, KeyClaim
    from jobs_platform.idempotency.unique import business_identity

__all__ = [
    "Claim",
    "IdempotencyKeys",
    "KeyClaim",
    "Transition",
    "business_identity",
    "claim_columns",
    "transition",
]

#: Exported name -> the module defining it.
_LAZY = {
    "Claim": "jobs_platform.idempotency.claim",
    "IdempotencyKeys": "jobs_platform.idempotency.keys",
    "KeyClaim": "jobs_platform.idempotency.keys",
    "Transition": "jobs_platform.idempotency.cas",
    "business_identity": "jobs_platform.idempotency.unique",
    "claim_columns": "jobs_platform.idempotency.cas",
    "transition": "jobs_platform.idempotency.cas",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
