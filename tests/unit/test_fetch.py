"""The pure parts of the kill-safe fetch (jobs_platform.brokers.redis.fetch): no broker.

Which script a server gets, the lists a fetch looks at and in which order, how a reply is
read, and QoS.append leaving Redis alone for the message the fetch recorded.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
from kombu.transport import redis as kombu_redis

from jobs_platform.brokers.redis import fetch
from jobs_platform.brokers.redis.fetch import KillSafeQoS

SEP = kombu_redis.Channel.sep


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("7.0.15", (7, 0, 15)),
        ("6.2.0", (6, 2, 0)),
        ("7.2.4-rc1", (7, 2, 4)),
        ("255.255.255", (255, 255, 255)),
        ("", None),
        (None, None),
        ("unknown", None),
    ],
)
def test_server_versions_are_read_as_numbers(text: str | None, version: Any) -> None:
    assert fetch.server_version(text) == version


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        (None, None),
        ((5, 0, 14), None),
        ((6, 0, 20), None),
        ((6, 2), fetch.FETCH_SCRIPT),
        ((6, 2, 14), fetch.FETCH_SCRIPT),
        ((7, 0, 15), "#!lua flags=allow-oom\n" + fetch.FETCH_SCRIPT),
        ((8, 0), "#!lua flags=allow-oom\n" + fetch.FETCH_SCRIPT),
    ],
)
def test_a_server_without_blmove_gets_no_script_and_7_0_may_run_it_out_of_memory(
    version: tuple[int, ...] | None, expected: str | None
) -> None:
    assert fetch.script_for(version) == expected


def list_of(queue: str, priority: int) -> str:
    return f"{queue}{SEP}{priority}" if priority else queue


def test_a_fetch_looks_at_every_queues_list_of_a_priority_before_the_next_priority() -> None:
    assert fetch.fetch_lists(["a", "b"], list_of, [0, 3, 6, 9]) == [
        "a",
        "b",
        f"a{SEP}3",
        f"b{SEP}3",
        f"a{SEP}6",
        f"b{SEP}6",
        f"a{SEP}9",
        f"b{SEP}9",
    ]


def test_a_list_is_looked_at_once_even_if_two_steps_map_to_it() -> None:
    assert fetch.fetch_lists(["a"], lambda q, p: q, [0, 0, 3]) == ["a"]


@pytest.mark.parametrize(
    ("reply", "prefix", "expected"),
    [
        ([b"fast", b"{}", b"t1"], "", ("fast", b"{}", "t1")),
        ([b"pfx:fast\x06\x163", b"x", None], "pfx:", (f"fast{SEP}3", b"x", None)),
        ([b"fast", b"x", None], "pfx:", ("fast", b"x", None)),
    ],
)
def test_a_reply_is_read_without_the_global_key_prefix(
    reply: list[Any], prefix: str, expected: tuple[Any, ...]
) -> None:
    assert fetch.read_reply(reply, prefix) == expected


class RecordingClient:
    """Records the commands a pipeline would send (this test has no Redis)."""

    def __init__(self) -> None:
        self.commands: list[tuple[str, tuple[Any, ...]]] = []

    def pipeline(self) -> RecordingClient:
        return self

    def __getattr__(self, name: str) -> Any:
        def command(*args: Any) -> RecordingClient:
            self.commands.append((name, args))
            return self

        return command


def qos_of(recorded: str | None) -> tuple[KillSafeQoS, RecordingClient]:
    client = RecordingClient()

    @contextmanager
    def conn_or_acquire(client_: Any = None) -> Iterator[RecordingClient]:
        yield client

    channel = SimpleNamespace(
        kill_safe_recorded=recorded,
        conn_or_acquire=conn_or_acquire,
        unacked_key="unacked",
        unacked_index_key="unacked_index",
        visibility_timeout=10,
        do_restore=False,
        global_keyprefix="",
        jobs_owner="host/1/abc",
    )
    return KillSafeQoS(channel), client


def message(tag: str) -> Any:
    return SimpleNamespace(
        delivery_tag=tag, delivery_info={"exchange": "fast", "routing_key": "fast"}, _raw={}
    )


def test_qos_append_does_not_write_again_what_the_fetch_recorded() -> None:
    qos, client = qos_of("t1")
    qos.append(message("t1"), "t1")
    assert client.commands == []
    assert list(qos._delivered) == ["t1"]  # still tracked, acked and restored as before


def test_qos_append_writes_any_other_message_as_kombu_does() -> None:
    qos, client = qos_of("t1")
    qos.append(message("t2"), "t2")
    # kombu's write, then the owner's record (jobs_platform.brokers.redis.liveness).
    assert [name for name, _ in client.commands] == [
        "zadd",
        "hset",
        "execute",
        "sadd",
        "sadd",
        "execute",
    ]
    assert list(qos._delivered) == ["t2"]
