"""The Redis broker makes an app use the diverting transport (the URL unchanged), puts the
store's settings where the transport reads them, and revoke reaches the store."""

from __future__ import annotations

import ssl
from typing import Any

import pytest
from kombu.transport import redis as kombu_redis

from jobs_platform import create_app, delayed
from jobs_platform.brokers.memory import BROKER as MEMORY
from jobs_platform.brokers.redis import BROKER, CONTROL, RELEASER_STEP, TRANSPORT
from jobs_platform.brokers.redis.delayed import DEFAULT_PREFIX
from jobs_platform.brokers.redis.options import MARGIN, PREFIX, keys_for
from jobs_platform.brokers.redis.transport import Channel, Transport
from jobs_platform.delayed import control as control_module
from jobs_platform.settings import Settings


def installed(**overrides: Any) -> Any:
    return create_app("unit-delayed", **overrides)


def config(url: str) -> dict[str, Any]:
    return BROKER.celery_config(Settings(broker_url=url))


def test_a_redis_broker_keeps_its_url_and_gets_the_diverting_transport() -> None:
    app = installed(broker_url="redis://127.0.0.1:6399/3", visibility_margin=7.0)
    assert app.conf.broker_url == "redis://127.0.0.1:6399/3"
    assert app.conf.broker_transport == TRANSPORT
    conn = app.connection_for_write()
    assert conn.get_transport_cls() is Transport
    assert conn.transport_options[MARGIN] == 7.0
    assert conn.transport_options[PREFIX] == DEFAULT_PREFIX
    # kombu's own options are still there (the visibility timeout the rule reads).
    assert conn.transport_options["visibility_timeout"] == app.jobs_settings.visibility_timeout
    assert keys_for(app).due == f"{DEFAULT_PREFIX}:due"
    assert RELEASER_STEP in app.steps["worker"]
    assert app.control_cls == CONTROL
    assert isinstance(app.control, control_module.Control)


def test_install_twice_changes_nothing() -> None:
    app = installed()
    before = (dict(app.conf.broker_transport_options), set(app.steps["worker"]))
    BROKER.install(app)
    assert (dict(app.conf.broker_transport_options), set(app.steps["worker"])) == before


def test_the_channel_reads_the_margin_and_prefix_from_the_transport_options() -> None:
    assert {MARGIN, PREFIX} <= set(Channel.from_transport_options)
    assert set(kombu_redis.Channel.from_transport_options) <= set(Channel.from_transport_options)


def test_rediss_keeps_tls_when_the_transport_is_named() -> None:
    # kombu switches TLS on from the scheme only when it picks the transport itself.
    assert config("rediss://h:6380/0")["broker_use_ssl"] == {"ssl_cert_reqs": ssl.CERT_NONE}
    assert "broker_use_ssl" not in config("rediss://h/0?ssl_cert_reqs=required")
    assert "broker_use_ssl" not in config("redis://h/0")
    app = installed(broker_url="rediss://127.0.0.1:6380/0")
    assert app.connection_for_write().ssl


def test_an_in_process_broker_is_left_alone() -> None:
    made = MEMORY.celery_config(Settings(broker_url="memory://"))
    assert "broker_transport" not in made
    assert not {MARGIN, PREFIX} & set(made["broker_transport_options"])
    app = installed(broker_url="memory://")
    assert RELEASER_STEP not in app.steps["worker"] and app.control_cls != CONTROL
    assert delayed.store_of(app) is None and delayed.cancel_delayed(app, "x") is None


def test_revoke_cancels_every_id_in_the_store_then_does_celerys_revoke(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = installed()
    cancelled: list[str] = []
    broadcast: list[Any] = []
    monkeypatch.setattr(
        control_module, "cancel_delayed", lambda app, task_id: cancelled.append(task_id)
    )
    monkeypatch.setattr(
        control_module.CeleryControl,
        "revoke",
        lambda self, task_id, *a, **kw: broadcast.append((task_id, kw)),
    )
    app.control.revoke("a", terminate=False)
    app.control.revoke(["b", "c"])
    assert cancelled == ["a", "b", "c"]
    assert broadcast == [("a", {"terminate": False}), (["b", "c"], {})]
