"""Delays of any length: long waits go to a durable store on the broker, not to a worker.

::

    divert.py     which messages must wait in the store (wait + hard limit vs the
                  visibility timeout)                                     (pure)
    store.py      the sorted set + hash and the store/release/cancel scripts  (Redis)
    transport.py  kombu's Redis transport whose _put stores those messages  (kombu)
    releaser.py   release_now(); the bootstep thread in every worker        (Celery)
    control.py    revoke that also cancels a stored job                     (Celery)
    options.py    the store's settings, read from the broker transport options

A message is stored exactly as kombu would have queued it, and released by one atomic
script: exactly once with any number of releasers (docs/delayed-jobs.md).
:func:`install` wires it into an app; the transport, the bootstep and the control class
are given to Celery by name, so ``import jobs_platform`` loads none of them.
"""

from __future__ import annotations

import ssl
import urllib.parse
from typing import Any

from jobs_platform.delayed.options import MARGIN, PREFIX
from jobs_platform.urls import BROKER_SCHEMES

#: Celery's ``broker_transport`` for a Redis broker URL (the URL itself is unchanged).
TRANSPORT = "jobs_platform.delayed.transport:Transport"
#: The releaser bootstep.
RELEASER_STEP = "jobs_platform.delayed.releaser:ReleaserStep"
#: ``control_cls``: revoke reaches stored jobs.
CONTROL = "jobs_platform.delayed.control:Control"

__all__ = ["CONTROL", "RELEASER_STEP", "TRANSPORT", "celery_config", "install"]


def transport_options(settings: Any) -> dict[str, Any]:
    """The entries the store adds to ``broker_transport_options``."""
    return {
        MARGIN: float(settings.visibility_margin),
        PREFIX: str(settings.delayed_key_prefix),
    }


def celery_config(broker_url: str, *, broker_use_ssl: Any = None) -> dict[str, Any]:
    """Celery settings that make a Redis broker use :data:`TRANSPORT` ({} for another)."""
    parts = urllib.parse.urlsplit(broker_url)
    if parts.scheme not in BROKER_SCHEMES:
        return {}  # memory:// in unit tests: nothing waits long there
    config: dict[str, Any] = {"broker_transport": TRANSPORT}
    if parts.scheme == "rediss" and not broker_use_ssl and "ssl_" not in parts.query:
        # kombu turns TLS on from the *scheme* only when it picks the transport itself;
        # named explicitly, it needs it said. Same default as kombu's (with its warning).
        config["broker_use_ssl"] = {"ssl_cert_reqs": ssl.CERT_NONE}
    return config


def install(app: Any) -> None:
    """Divert long delays to the store, release them in every worker, revoke reaches them."""
    conf = app.conf
    config = celery_config(str(conf.broker_url), broker_use_ssl=conf.broker_use_ssl)
    if not config:
        return
    conf.update(config)
    conf.broker_transport_options = {
        **(conf.broker_transport_options or {}),
        **transport_options(app.jobs_settings),
    }
    app.steps["worker"].add(RELEASER_STEP)
    app.control_cls = CONTROL
