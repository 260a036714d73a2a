"""Defects a new user hit, caught at the earliest point (declaration, create_app, dispatch).

Pure unit tests: apps here use kombu's in-process transport and never start a worker; the
real-process proofs are in tests/acceptance/test_own_project.py.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from jobs_platform import ConfigError, DispatchError, ReliableTask, Settings, create_app
from jobs_platform.profiles import _cgroup_quota, available_cpus, worker_argv
from jobs_platform.urls import masked


def unit_app(name: str = "unit") -> object:
    return create_app(name, broker_url="memory://", result_backend="cache+memory://")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis:/127.0.0.1:6391/0", r"JOBS_BROKER_URL='redis:/127.0.0.1:6391/0' has no host"),
        # RabbitMQ is a broker now, but not without a Redis for coordination.
        ("amqp://guest:s3cret@localhost//", r"JOBS_COORDINATION_URL must name one"),
        (
            "kafka://guest:s3cret@localhost",
            r"scheme must be redis:// or rediss:// or sentinel:// or amqp://",
        ),
        ("redis://u:s3cret@host:6379/zero", r"must be a database number"),
        ("redis://127.0.0.1:99999/0", r"not a valid URL"),
        ("127.0.0.1:6379", r"scheme must be"),
    ],
)
def test_a_bad_broker_url_fails_at_create_app_naming_the_setting(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        create_app("badurl", broker_url=url)
    assert "s3cret" not in str(caught.value)


def test_masked_hides_only_the_password() -> None:
    assert masked("redis://user:pw@host:6379/1") == "redis://user:***@host:6379/1"
    assert masked("redis://:pw@host/0") == "redis://:***@host/0"
    assert masked("redis://host:6379/0") == "redis://host:6379/0"


def test_dispatch_timeout_bounds_every_connection_wait() -> None:
    app = create_app("bounded", broker_url="redis://127.0.0.1:6399/0", dispatch_timeout=2)
    conf = app.conf
    assert conf.broker_transport_options["socket_connect_timeout"] == 0.5
    assert conf.result_backend_transport_options["retry_policy"]["timeout"] == 1.0
    assert conf.task_publish_retry_policy["max_retries"] == 2
    with pytest.raises(ConfigError, match="dispatch_timeout"):
        Settings.load(environ={"JOBS_DISPATCH_TIMEOUT": "0"})


def test_a_misspelt_decorator_option_is_refused_with_a_hint() -> None:
    app = unit_app()
    with pytest.raises(ConfigError, match=r"unknown option 'transient_error'.*'transient_errors'"):

        @app.task(base=ReliableTask, queue="fast", transient_error=(KeyError,))
        def job() -> None: ...

    with pytest.raises(ConfigError, match=r"unknown option 'max_retry'.*'max_retries'"):

        @app.task(base=ReliableTask, queue="fast", max_retry=3)
        def job2() -> None: ...


def test_a_misspelt_class_attribute_is_refused_with_a_hint() -> None:
    app = unit_app()

    class Misspelt(ReliableTask):
        name = "unit.misspelt"
        queue = "fast"
        transient_error = (KeyError,)

        def run(self) -> None: ...

    with pytest.raises(ConfigError, match=r"'transient_error'.*did you mean 'transient_errors'"):
        app.register_task(Misspelt())


def test_celery_options_and_own_helpers_are_not_refused() -> None:
    app = unit_app()

    @app.task(base=ReliableTask, queue="fast", ignore_result=True, rate_limit="10/s", bind=True)
    def plain(self: object) -> None: ...

    class WithHelpers(ReliableTask):
        name = "unit.helpers"
        queue = "fast"
        endpoint = "https://partner.example/api"  # the app's own attribute, not an option

        def run(self) -> None: ...

    app.register_task(WithHelpers())
    assert plain.ignore_result is True


def test_class_based_tasks_check_arguments_at_dispatch() -> None:
    app = unit_app()

    class Charge(ReliableTask):
        name = "unit.charge"
        queue = "thirdparty"

        def run(self, invoice_id: int) -> None: ...

    task = app.register_task(Charge())
    with pytest.raises(TypeError, match=r"unit.charge: .*takes 2 positional arguments"):
        task.delay(1, "t", 3)
    with pytest.raises(TypeError, match="unexpected keyword"):
        task.delay(invoice=1)


def test_an_unknown_queue_at_dispatch_is_a_dispatch_error_naming_the_queues() -> None:
    app = unit_app()

    @app.task(base=ReliableTask, queue="heavy")
    def crunch() -> None: ...

    with pytest.raises(DispatchError, match=r"unknown queue 'nope'.*fast, heavy, thirdparty"):
        crunch.apply_async(queue="nope")
    assert crunch.queue == "heavy"


def test_task_queue_is_the_routed_queue() -> None:
    app = create_app("routed", broker_url="memory://", routes={"billing.*": "thirdparty"})

    @app.task(base=ReliableTask, name="billing.pay")
    def pay() -> None: ...

    assert pay.queue == "thirdparty"


def test_a_near_miss_jobs_variable_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="jobs_platform.settings"):
        Settings.load(environ={"JOBS_TASK_EVENT": "0", "JOBS_APP": "myproj.jobs"})
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "JOBS_TASK_EVENT is not a jobs-platform setting and is ignored; "
        "did you mean JOBS_TASK_EVENTS?"
    ]


def test_the_long_countdown_message_points_at_what_exists() -> None:
    app = create_app("delays", broker_url="memory://", visibility_timeout=120, visibility_margin=10)

    @app.task(base=ReliableTask, queue="fast", time_limit=10, retry_backoff_max=20)
    def remind() -> None: ...

    # Beyond the visibility timeout is no longer refused (the delayed store holds it);
    # beyond JOBS_MAX_DELAY the message points at what exists.
    with pytest.raises(DispatchError) as caught:
        remind.apply_async(countdown=31 * 86400)
    assert "database-backed" not in str(caught.value)
    assert "celery beat" in str(caught.value)


def test_worker_argv_uses_the_app_path_concurrency_and_extra_options() -> None:
    argv = worker_argv("myproj.jobs", "heavy", concurrency=3, extra=["--max-memory-per-child", "9"])
    assert argv[:4] == ["celery", "-A", "myproj.jobs", "worker"]
    assert argv[argv.index("-c") + 1] == "3"
    assert argv[-2:] == ["--max-memory-per-child", "9"]
    for clash in (["-P", "threads"], ["-Q", "fast"], ["--pool=solo"], ["--prefetch-multiplier=4"]):
        with pytest.raises(ValueError, match="profile decides"):
            worker_argv("myproj.jobs", "heavy", extra=clash)


def test_cpu_quota_comes_from_the_cgroup_not_the_host(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert _cgroup_quota(tmp_path) == 1.5
    assert available_cpus(tmp_path) == min(2, available_cpus(tmp_path / "none"))
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert _cgroup_quota(tmp_path) is None
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("100000")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000")
    assert available_cpus(v1) == 1


def test_a_retry_publish_that_failed_on_a_dead_broker_is_still_seen_as_broker_down() -> None:
    """The worker requeues (instead of dead-lettering) a retry whose publish failed because
    the broker was unreachable; dispatch now wraps that failure in a DispatchError."""
    from jobs_platform import brokers
    from jobs_platform.dispatch import broker_down

    redis_broker = brokers.for_url("redis://127.0.0.1:6379/0")
    try:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except ConnectionRefusedError as refused:
            raise DispatchError("the broker did not answer") from refused
    except DispatchError as wrapped:
        assert broker_down(redis_broker, wrapped)
    assert not broker_down(redis_broker, DispatchError("arguments must be JSON"))


def test_binding_again_keeps_what_was_declared() -> None:
    """Celery binds every task a second time when a worker finalizes the app; the spec must
    come out the same (it once lost rate_limit, which binding hands to Celery as None)."""
    app = unit_app()

    @app.task(base=ReliableTask, queue="fast", rate_limit="5/s", time_limit=9, max_retries=2)
    def limited() -> None: ...

    first = limited.spec
    type(limited).bind(app)
    assert limited.spec == first
    assert str(limited.spec.rate) == "5/1s"
    assert (limited.rate_limit, limited.time_limit) == (None, 9.0)
