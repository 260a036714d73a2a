"""The flow options (concurrency_key/limit, debounce/debounce_key/debounce_max) are checked
when the task is declared, and a key function's answer when a job is dispatched (pure: a
memory:// app, no broker contact)."""

from __future__ import annotations

from typing import Any

import pytest

from jobs_platform import ConfigError, ReliableTask, create_app
from jobs_platform.flow import options


@pytest.fixture()
def app() -> Any:
    return create_app("unit", broker_url="memory://", result_backend="cache+memory://")


def body(account: str, n: int = 0) -> None:
    return None


def declare(app: Any, name: str, **declared: Any) -> Any:
    return app.task(base=ReliableTask, name=name, queue="fast", **declared)(body)


def test_a_concurrency_key_defaults_to_a_limit_of_one(app: Any) -> None:
    task = declare(app, "u.one", concurrency_key=lambda account, n=0: account)
    assert task.spec.concurrency is not None and task.spec.concurrency.limit == 1
    limited = declare(app, "u.three", concurrency_key=lambda a, n=0: a, concurrency_limit=3)
    assert limited.spec.concurrency.limit == 3
    assert declare(app, "u.none").spec.concurrency is None


@pytest.mark.parametrize(
    ("declared", "words"),
    [
        ({"concurrency_limit": 2}, "concurrency_limit needs a concurrency_key"),
        ({"concurrency_key": "account"}, "concurrency_key is a callable"),
        ({"concurrency_key": len, "concurrency_limit": 0}, "concurrency_limit is an int >= 1"),
        ({"concurrency_key": len, "concurrency_limit": 1.5}, "concurrency_limit is an int >= 1"),
        ({"concurrency_key": len, "concurrency_limit": True}, "concurrency_limit is an int >= 1"),
        ({"debounce": 0}, "debounce is a number of seconds > 0"),
        ({"debounce": "2s"}, "debounce is a number of seconds > 0"),
        ({"debounce_key": len}, "need debounce=<seconds>"),
        ({"debounce": 2, "debounce_key": "doc"}, "debounce_key is a callable"),
        ({"debounce": 2, "debounce_max": 1}, "debounce_max is a number of seconds >= debounce"),
        ({"debounce": 2, "unique_for": 60}, "declare one of them"),
    ],
)
def test_bad_flow_options_are_refused_at_declaration(
    app: Any, declared: dict[str, Any], words: str
) -> None:
    with pytest.raises(ConfigError, match=words):
        declare(app, "u.bad", **declared)
    assert "u.bad" not in app.tasks  # a refused task is not left callable


def test_debounce_max_defaults_to_ten_windows(app: Any) -> None:
    task = declare(app, "u.deb", debounce=2, debounce_key=lambda account, n=0: account)
    assert task.spec.debounce == options.Debounce(2.0, 20.0, task.spec.debounce.key)


def test_a_class_declares_key_functions_as_plain_or_static_methods(app: Any) -> None:
    class PerAccount(ReliableTask):  # type: ignore[misc]
        name = "u.per_account"
        queue = "fast"
        concurrency_key = staticmethod(lambda account, n=0: account)
        concurrency_limit = 2

        def run(self, account: str, n: int = 0) -> None:
            return None

    task = app.register_task(PerAccount())
    assert task.spec.concurrency.limit == 2
    assert task.spec.concurrency.key("acct-1") == "acct-1"


def test_a_key_function_that_fails_on_the_arguments_is_refused_at_dispatch(app: Any) -> None:
    from jobs_platform import DispatchError

    task = declare(app, "u.keyed", concurrency_key=lambda account, n=0: account["id"])
    with pytest.raises(DispatchError, match=r"concurrency_key failed .* TypeError"):
        task.delay("acct-1")
    non_str = declare(app, "u.nonstr", concurrency_key=lambda account, n=0: n)
    with pytest.raises(DispatchError, match="must return a non-empty str, got 3"):
        non_str.delay("acct-1", 3)
    debounced = declare(app, "u.debkey", debounce=1, debounce_key=lambda account, n=0: None)
    with pytest.raises(DispatchError, match="debounce_key must return a non-empty str"):
        debounced.delay("acct-1")


def test_a_debounced_task_refuses_bulk_dispatch_before_sending_anything(app: Any) -> None:
    from jobs_platform import DispatchError

    task = declare(app, "u.deb_bulk", debounce=1, debounce_key=lambda account, n=0: account)
    with pytest.raises(DispatchError, match="one call at a time"):
        task.delay_many([("a",), ("b",)])
    with pytest.raises(DispatchError, match="one call at a time"):
        task.apply_async_many([(("a",), {})])


def test_fairness_key_is_refused_at_declaration_on_a_broker_without_fair_queues() -> None:
    why = "its queues are FIFO exchanges"  # what a broker without fair queues would say
    with pytest.raises(ConfigError, match=r"fairness_key needs a broker .*: its queues are FIFO"):
        options.fairness(lambda account, n=0: account, task="u.fair", no_fair_queues=why)


def test_a_fairness_key_is_checked_on_the_dispatched_arguments(app: Any) -> None:
    from jobs_platform import DispatchError

    task = declare(app, "u.fair", fairness_key=lambda account, n=0: account)
    assert task.spec.fairness_key("acct-1") == "acct-1"
    with pytest.raises(DispatchError, match="fairness_key must return a non-empty str, got 3"):
        task.delay(3)
    with pytest.raises(DispatchError, match=r"call 1 of 2 refused.*fairness_key must return"):
        task.delay_many([("a",), (3,)])


@pytest.mark.parametrize("key", ["account", 3, ("account",)])
def test_a_fairness_key_that_is_not_a_callable_is_refused(key: Any) -> None:
    with pytest.raises(ConfigError, match="fairness_key is a callable"):
        options.fairness(key, task="u.fair", no_fair_queues=None)


def test_a_fairness_key_on_a_broker_with_fair_queues_is_kept() -> None:
    def tenant(account: str, n: int = 0) -> str:
        return account

    assert options.fairness(tenant, task="u.fair", no_fair_queues=None) is tenant
    assert options.fairness(None, task="u.fair", no_fair_queues="no") is None
