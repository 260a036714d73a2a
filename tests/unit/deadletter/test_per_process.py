"""One cache of per-process objects: a forked pool child releases what it inherited (database
engines without closing the parent's connections) and builds its own."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa

from jobs_platform import db, process_local
from jobs_platform.deadletter import hooks


def in_a_forked_child(check: Callable[[], str]) -> str:
    """Run ``check()`` (returning a short report) in a forked child; its report."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        try:
            report = check()
        except BaseException as exc:
            report = f"error: {exc!r}"
        finally:
            os.write(write, report.encode()[:4096])
            os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read) as pipe:
        report = pipe.read()
    assert os.waitstatus_to_exitcode(status) == 0, report
    return report


def test_the_same_object_per_process_and_key() -> None:
    key = ("probe", object())
    first: list[int] = process_local.per_process(key, list)
    assert process_local.per_process(key, list) is first
    assert process_local.per_process(("probe", object()), list) is not first


def test_a_pool_child_releases_inherited_engines_and_builds_its_own(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/jobs.sqlite3"
    parent = db.engine_for(url)
    with parent.connect() as conn:
        conn.execute(sa.text("SELECT 1"))  # the pool now holds a connection
    inherited_pool = parent.pool

    def child() -> str:
        hooks.on_worker_process_init()  # what Celery runs in a new pool process
        own = db.engine_for(url)
        with own.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        return ",".join(
            [
                "released" if parent.pool is not inherited_pool else "kept",
                "own" if own is not parent else "shared",
            ]
        )

    assert in_a_forked_child(child) == "released,own"
    # The parent still has its engine and its pool, untouched by the child.
    assert db.engine_for(url) is parent and parent.pool is inherited_pool
    with parent.connect() as conn:
        assert conn.execute(sa.text("SELECT 1")).scalar() == 1


def test_forgetting_inherited_objects_calls_their_release_once() -> None:
    released: list[object] = []
    key = ("probe", object())
    mine = process_local.per_process(key, object, release=released.append)

    def child() -> str:
        process_local.forget_inherited()
        process_local.forget_inherited()  # nothing left to release
        again = process_local.per_process(key, object, release=released.append)
        return f"{len(released)},{released[0] is mine},{again is not mine}"

    assert in_a_forked_child(child) == "1,True,True"
    assert released == [] and process_local.per_process(key, object) is mine
