"""``sentinel://`` URLs: their shape is checked when the app is created, the master's name
reaches kombu and Celery as ``master_name``, and the platform's own clients are Sentinel
clients of the master (pure: nothing is contacted; the failover itself is in
tests/integration/redis/test_sentinel.py and tests/acceptance/test_sentinel_failover.py)."""

from __future__ import annotations

import pytest
import redis.sentinel

from jobs_platform import brokers, create_app, redis_urls
from jobs_platform.brokers.redis import SENTINEL_TRANSPORT, TRANSPORT, RedisBroker
from jobs_platform.errors import ConfigError
from jobs_platform.urls import masked

URL = "sentinel://:s3cret@127.0.0.1:26391/2;sentinel://:s3cret@127.0.0.1:26392/2#jobsmaster"


def test_a_sentinel_url_names_its_sentinels_master_database_and_password() -> None:
    target = redis_urls.parse_sentinel(URL)
    assert target.sentinels == (("127.0.0.1", 26391), ("127.0.0.1", 26392))
    assert (target.master, target.db, target.password, target.username) == (
        "jobsmaster",
        2,
        "s3cret",
        None,
    )
    # The fragment may repeat on every entry; the default port is Sentinel's.
    again = redis_urls.parse_sentinel("sentinel://a#m;sentinel://b:1#m")
    assert again.sentinels == (("a", 26379), ("b", 1))
    assert (again.master, again.db) == ("m", 0)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("sentinel://h1:26379;sentinel://h2:26379", "no master name: end the URL with #MASTER"),
        ("sentinel://h1#a;sentinel://h2#b", "different masters"),
        ("sentinel://:p@h1/0;sentinel://h2/0#m", "same user, password and /db"),
        ("sentinel://h1/1;sentinel://h2/2#m", "same user, password and /db"),
        ("sentinel://h1/zero#m", "database number"),
        ("sentinel://h1:26379;redis://h2:6379#m", "every entry must be sentinel://"),
        ("sentinel://h1:26379?ssl_cert_reqs=none#m", "query options are not supported"),
        ("sentinel://:0#m", "no host"),
    ],
)
def test_a_bad_sentinel_url_is_refused_when_the_app_is_created(url: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says) as refused:
        create_app("badsentinel", broker_url=url)
    assert "JOBS_BROKER_URL=" in str(refused.value)
    with pytest.raises(ConfigError, match=says):
        create_app("badsentinel", coordination_url=url)


def test_the_master_name_and_sentinel_timeouts_reach_kombu_and_celery() -> None:
    app = create_app("sentinelconf", broker_url=URL)
    assert app.conf.broker_transport == SENTINEL_TRANSPORT
    for key in ("broker_transport_options", "result_backend_transport_options"):
        options = app.conf[key]
        assert options["master_name"] == "jobsmaster"
        # Celery's result backend would reach the Sentinels with no timeout at all.
        assert options["sentinel_kwargs"]["socket_timeout"] > 0
    # The URL itself goes to Celery unchanged: kombu and Celery read no fragment.
    assert app.conf.broker_url == URL
    plain = create_app("plainconf", broker_url="redis://127.0.0.1:6399/0")
    assert plain.conf.broker_transport == TRANSPORT
    assert "master_name" not in plain.conf.broker_transport_options


def test_a_redis_broker_with_a_sentinel_result_backend_names_that_master() -> None:
    app = create_app("backendonly", broker_url="redis://127.0.0.1:6399/0", result_backend=URL)
    assert app.conf.result_backend_transport_options["master_name"] == "jobsmaster"
    assert "master_name" not in app.conf.broker_transport_options


def test_the_platforms_clients_of_a_sentinel_url_ask_the_sentinels_for_the_master() -> None:
    client = redis_urls.client(URL, socket_timeout=2, socket_connect_timeout=1)
    pool = client.connection_pool
    assert isinstance(pool, redis.sentinel.SentinelConnectionPool)
    assert pool.service_name == "jobsmaster"
    assert pool.connection_kwargs["db"] == 2
    assert pool.connection_kwargs["password"] == "s3cret"
    sentinels = pool.sentinel_manager.sentinels
    assert [s.connection_pool.connection_kwargs["port"] for s in sentinels] == [26391, 26392]
    # The Sentinels are reached with bounded timeouts and without the master's password.
    assert all(s.connection_pool.connection_kwargs["socket_timeout"] == 1 for s in sentinels)
    assert all(not s.connection_pool.connection_kwargs.get("password") for s in sentinels)


def test_every_entrys_password_is_masked() -> None:
    assert masked(URL) == (
        "sentinel://:***@127.0.0.1:26391/2;sentinel://:***@127.0.0.1:26392/2#jobsmaster"
    )
    assert "s3cret" not in masked(URL)


def test_sentinel_is_a_scheme_of_the_redis_broker() -> None:
    assert isinstance(brokers.for_url(URL), RedisBroker)
    assert "sentinel" in brokers.WORKER_SCHEMES
