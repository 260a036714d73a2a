"""Idempotency: at-least-once delivery never repeats a side effect.

Three guards, from the strongest to a courtesy:

* :func:`transition` (:mod:`.transition`): a status compare-and-swap on the app's own row,
  committed before the side effect; duplicates return without running it.
* :class:`IdempotencyKeys` (:mod:`.keys`): the platform's key table, for side effects on
  services that cannot dedupe; a duplicate gets the recorded result back. Tasks also expose
  ``task.idempotency_key`` for services that honour an ``Idempotency-Key`` header.
* unique dispatch (:mod:`.unique`): ``unique_for=`` on a task; enqueue-time only.
"""

from jobs_platform.idempotency.keys import IdempotencyKeys, KeyClaim
from jobs_platform.idempotency.transition import Claim, Transition, claim_columns, transition
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
