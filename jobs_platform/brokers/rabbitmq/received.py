"""What a worker does with a message that arrived through native delayed delivery.

Connected to Celery's ``task_received`` (the consumer, before the job is run or timed):

- its routing key is the queue's own again: Celery spells the delay in front of it
  (``0.0.…1.1.fast``) and the message keeps that key when it arrives; the platform reads
  the delivery's routing key as "the queue this job came from" (a retry goes back there,
  a dead letter names it), so the 28 words of the delay are taken off;
- a revoked one is marked revoked (:mod:`.revoke`).
"""

from __future__ import annotations

from typing import Any

from jobs_platform.brokers.rabbitmq import revoke
from jobs_platform.brokers.rabbitmq.delays import queue_key


def on_received(sender: Any = None, request: Any = None, **_: Any) -> None:
    if request is None or not getattr(request, "eta", None):
        return  # only a delayed message (it has an ETA) came through the delay levels
    app = getattr(request, "_app", None)
    if getattr(app, "jobs_settings", None) is None:
        return
    delivery = request.delivery_info
    if isinstance(delivery, dict) and isinstance(delivery.get("routing_key"), str):
        delivery["routing_key"] = queue_key(delivery["routing_key"])
    revoke.mark_if_revoked(app, request)
