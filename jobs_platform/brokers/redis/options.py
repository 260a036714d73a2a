"""The delayed store's settings as every part reads them: from the broker transport options.

The transport only sees kombu's transport options, so those are the one source: the
releaser, revoke and the CLI read the same two entries (put there by the broker's
``celery_config``), and nobody can disagree about the key prefix.
"""

from __future__ import annotations

from typing import Any

from jobs_platform.brokers.redis.delayed import DEFAULT_PREFIX, Keys
from jobs_platform.process_local import redis_client

#: Transport option: seconds kept below the visibility timeout (``JOBS_VISIBILITY_MARGIN``).
MARGIN = "jobs_delay_margin"
#: Transport option: the store's Redis key prefix.
PREFIX = "jobs_delayed_prefix"
#: Transport option: a consuming channel's liveness lease (``JOBS_WORKER_LEASE``, seconds).
WORKER_LEASE = "jobs_worker_lease"


def transport_options(settings: Any) -> dict[str, Any]:
    """The platform's entries in ``broker_transport_options``: the delayed store's, and the
    worker lease (:mod:`.liveness`)."""
    return {
        MARGIN: float(settings.visibility_margin),
        PREFIX: str(settings.delayed_key_prefix),
        WORKER_LEASE: float(settings.worker_lease),
    }


def keys_for(app: Any) -> Keys:
    """The store keys of ``app``."""
    transport = app.conf.broker_transport_options or {}
    return Keys(str(transport.get(PREFIX) or DEFAULT_PREFIX))


def client_for(app: Any) -> Any:
    """This process's Redis client for ``app``'s broker (where the store lives)."""
    return redis_client(str(app.conf.broker_url))
