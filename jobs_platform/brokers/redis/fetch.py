"""Kill-safe fetch: a message leaves its queue list and enters ``unacked`` in one step.

kombu's Redis consumer takes a message with ``BRPOP`` and records it in the ``unacked``
hash and ``unacked_index`` sorted set (``QoS.append``) only after the worker has read the
reply: a worker SIGKILLed in between loses the message for good (celery/kombu#305,
celery/celery#4354). :class:`KillSafeFetch` closes that gap on the server:

- **fetch** (:data:`FETCH_SCRIPT`): one Lua script takes the first non-empty list among the
  consumed queues' priority lists (kombu's order: every queue's base list, then every
  queue's ``\\x06\\x163`` list, ...), writes the ``unacked`` entry kombu would write
  (``[message, exchange, routing_key]``, with the queue item embedded verbatim) and its
  ``unacked_index`` score (this host's clock, as kombu's), and pops it. A killed worker's
  message is therefore always somewhere: in its list, or in ``unacked`` (restored after the
  visibility timeout). An item that is not a message envelope is popped and handed back
  unrecorded, for :meth:`~KillSafeFetch.kill_safe_admit` or kombu to deal with.
- **block without popping**: an idle consumer waits with ``BLMOVE base base RIGHT RIGHT``
  (the tail moves to the tail of the same list: nothing leaves it) on the base list of the
  first queue in kombu's cycle, then fetches. While fetches find messages the consumer
  keeps fetching without blocking.

Both commands go out on kombu's consuming connection and are read by kombu's event loop,
so its health check, pause-on-prefetch, re-auth flush and reconnect handling apply as to
``BRPOP``. ``QoS.append`` skips its own Redis write for a message the script recorded.

Trade-offs: a message arriving in a priority sub-list or another consumed queue while the
consumer blocks on the first base list waits until that block times out (``brpop_timeout``,
1 s), and every consumer blocked on a list wakes for each message pushed to it (the losers'
fetches find nothing). Requires Redis >= 6.2 (``BLMOVE``); an older server, or a channel
without kombu's ack emulation, gets kombu's behaviour and one warning. A server out of
memory (``noeviction``) refuses ``BLMOVE`` but not ``BRPOP``: the consumer then does one
kombu ``BRPOP`` per refusal, so that consuming (which frees memory) goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from functools import cached_property
from queue import Empty
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads
from redis.exceptions import NoScriptError, OutOfMemoryError

from jobs_platform.brokers.redis import fair, liveness

logger = logging.getLogger("jobs_platform.fetch")

#: The oldest server with ``BLMOVE``.
MIN_SERVER = (6, 2)
#: From this version a script can declare ``allow-oom``.
SHEBANG_SERVER = (7, 0)

#: KEYS: the lists to take from, in order, then the unacked hash, the unacked index, and
#: the owner's held set, the owners set and the owner's lease (:mod:`.liveness`).
#: ARGV[1]: the index score (seconds since the epoch); ARGV[2]: the owner; ARGV[3]: its lease
#: in ms; ARGV[3 + i]: ``1`` if a message from list i is acknowledged later (recorded), ``0``
#: for a consumer that takes no acks (a control reply: kombu records none for it), ``F``
#: when KEYS[i] is a queue's fair ring (:mod:`.fair`): the ring head's list is taken from,
#: recorded, and the head rotated to the tail (dropped when its list is empty).
#: Returns ``{list, item, tag}`` (tag nil when the item was not recorded: not an envelope
#: kombu could record, or not to be acknowledged; list is the ring for a keyed message) or
#: nil. The item is read before anything is written and popped last: a server that refuses
#: the writes (out of memory) leaves the item in its list.
FETCH_SCRIPT = """
local n = #KEYS - 5
local function record(item)
    local ok, message = pcall(cjson.decode, item)
    if ok and type(message) == 'table' and type(message.properties) == 'table' then
        local t = message.properties.delivery_tag
        local info = message.properties.delivery_info
        if type(t) == 'string' and t ~= '' and type(info) == 'table'
                and type(info.exchange) == 'string'
                and type(info.routing_key) == 'string' then
            redis.call('HSET', KEYS[n + 1], t, '[' .. item .. ','
                .. cjson.encode(info.exchange) .. ','
                .. cjson.encode(info.routing_key) .. ']')
            redis.call('ZADD', KEYS[n + 2], ARGV[1], t)
            redis.call('SADD', KEYS[n + 3], t)
            redis.call('SADD', KEYS[n + 4], ARGV[2])
            redis.call('SET', KEYS[n + 5], '1', 'PX', ARGV[3])
            return t
        end
    end
    return false
end
for i = 1, n do
    if ARGV[3 + i] == 'F' then
        local ring = KEYS[i]
        -- A key is in the ring iff its list has work; a stale head (list emptied by
        -- hand) is dropped, a bounded number of times per fetch.
        for _ = 1, 8 do
            local key = redis.call('LINDEX', ring, 0)
            if not key then break end
            local sub = ring .. ':' .. key
            local item = redis.call('LINDEX', sub, -1)
            if item then
                local tag = record(item)
                redis.call('RPOP', sub)
                redis.call('DECR', ring .. '#')
                if redis.call('LLEN', sub) == 0 then
                    redis.call('LPOP', ring)
                else
                    redis.call('LMOVE', ring, ring, 'LEFT', 'RIGHT')
                end
                return {ring, item, tag}
            end
            redis.call('LPOP', ring)
        end
    else
        local item = redis.call('LINDEX', KEYS[i], -1)
        if item then
            local tag = false
            if ARGV[3 + i] == '1' then tag = record(item) end
            redis.call('RPOP', KEYS[i])
            return {KEYS[i], item, tag}
        end
    end
end
return false
"""

#: Consecutive kombu ``BRPOP`` polls after the server refused ``BLMOVE`` for lack of memory.
OOM_PLAIN_POLLS = 1
#: Seconds between two warnings that the server is out of memory.
OOM_WARNING_INTERVAL_S = 60.0


def server_version(text: str | None) -> tuple[int, ...] | None:
    """``"7.0.15"`` as ``(7, 0, 15)``; None when it does not read as a version."""
    if not text:
        return None
    parts = []
    for part in text.split("."):
        digits = part[: len(part) - len(part.lstrip("0123456789"))]
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) or None


def script_for(version: tuple[int, ...] | None) -> str | None:
    """The fetch script for a server of ``version``, or None when it cannot run it."""
    if version is None or version < MIN_SERVER:
        return None
    if version >= SHEBANG_SERVER:
        # The script moves an item from a list into a hash (about no memory), and refusing
        # it on a full server would stop the consumers that would free memory.
        return "#!lua flags=allow-oom\n" + FETCH_SCRIPT
    return FETCH_SCRIPT


def fetch_lists(queues: Sequence[str], list_of: Any, steps: Sequence[int]) -> list[str]:
    """The lists a fetch takes from, in kombu's ``BRPOP`` order: priority-major."""
    return list(queues_of_lists(queues, list_of, steps))


def queues_of_lists(queues: Sequence[str], list_of: Any, steps: Sequence[int]) -> dict[str, str]:
    """Each list a fetch takes from (in kombu's order) -> the queue it belongs to."""
    return {list_of(queue, pri): queue for pri in steps for queue in queues}


def read_reply(reply: Sequence[Any], prefix: str) -> tuple[str, bytes, str | None]:
    """A fetch reply as (list key without the global key prefix, raw item, recorded tag)."""
    key, item, tag = reply
    name = bytes_to_str(key)
    if prefix and name.startswith(prefix):
        name = name[len(prefix) :]
    return name, item, None if tag is None else bytes_to_str(tag)


class KillSafeQoS(liveness.OwnedQoS, kombu_redis.QoS):  # type: ignore[misc]
    """kombu's Redis QoS that does not write again what the fetch script already wrote, and
    whose jobs belong to the channel's owner (:mod:`.liveness`)."""

    def append(self, message: Any, delivery_tag: str) -> None:
        if delivery_tag is not None and delivery_tag == self.channel.kill_safe_recorded:
            virtual.QoS.append(self, message, delivery_tag)  # local bookkeeping only
            return
        super().append(message, delivery_tag)
        # kombu's own fetch (no kill-safe script): the owner's record follows the write.
        with self.channel.conn_or_acquire() as client:
            client.pipeline().sadd(self._jobs_held_key(), delivery_tag).sadd(
                self.channel.global_keyprefix + liveness.OWNERS_KEY, self.jobs_owner
            ).execute()


class KillSafeFetch(kombu_redis.Channel):  # type: ignore[misc]
    """kombu's Redis channel whose consumer fetches kill-safe (module doc)."""

    QoS = KillSafeQoS

    #: Seconds an owner's lease lasts without renewal (transport option
    #: ``jobs_worker_lease``, ``JOBS_WORKER_LEASE``).
    jobs_worker_lease: float = 15.0

    @cached_property
    def jobs_owner(self) -> str:
        """This channel's owner id (:mod:`.liveness`): one per channel, so a reconnect's new
        channel does not keep the old one's jobs."""
        return liveness.new_owner()

    #: False: kombu's ``BRPOP``, as if this class were not there.
    kill_safe_fetch: bool = True
    #: The delivery tag the fetch recorded, while the message is being delivered.
    kill_safe_recorded: str | None = None

    _kill_safe_checked = False
    _kill_safe_script: str | None = None
    _kill_safe_sha: str | None = None
    #: What the consuming connection waits on: "EVALSHA", "BLMOVE", or None (kombu's own).
    _kill_safe_sent: str | None = None
    #: Fetch before blocking: a message may be waiting where ``BLMOVE`` does not look.
    _kill_safe_hot = True
    _kill_safe_plain_polls = 0
    _kill_safe_oom_warned_at = float("-inf")

    # -- the hook -------------------------------------------------------------------------

    def kill_safe_admit(self, key: str, item: bytes) -> bool:
        """Whether a fetched ``item`` (popped from list ``key``) may be delivered.

        A refusal must have dealt with the item (it is gone from the queue): its
        ``unacked`` entry, if any, is then dropped. Override to screen items.
        """
        return True

    # -- kombu's consuming seams ------------------------------------------------------------

    @cached_property
    def _jobs_no_ack(self) -> set[str]:
        """Queues consumed without acknowledgements (control replies): never recorded."""
        return set()

    def basic_consume(
        self, queue: str, no_ack: bool, callback: Any, consumer_tag: str, **kwargs: Any
    ) -> Any:
        (self._jobs_no_ack.add if no_ack else self._jobs_no_ack.discard)(queue)
        return super().basic_consume(
            queue, no_ack=no_ack, callback=callback, consumer_tag=consumer_tag, **kwargs
        )

    def _brpop_start(self, timeout: float | None = None) -> None:
        if not self._kill_safe_ready():
            return super()._brpop_start(timeout)  # type: ignore[no-any-return]
        if self._kill_safe_plain_polls:
            self._kill_safe_plain_polls -= 1
            return super()._brpop_start(timeout)  # type: ignore[no-any-return]
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues:
            return None
        if self._kill_safe_hot:
            command = ["EVALSHA", *self._kill_safe_fetch_args(queues)]
        else:
            base = self.global_keyprefix + queues[0]
            wait = self.brpop_timeout if timeout is None else timeout
            command = ["BLMOVE", base, base, "RIGHT", "RIGHT", wait or 0]
        connection = self.client.connection
        self._in_poll = connection
        self._brpop_sent_at = time.monotonic()
        connection.send_command(*command)
        self._kill_safe_sent = command[0]
        return None

    def _brpop_read(self, **options: Any) -> bool:
        sent = self._kill_safe_sent
        if sent is None:
            return bool(super()._brpop_read(**options))
        self._kill_safe_sent = None
        try:
            reply = self._kill_safe_reply(sent, options)
            if sent == "BLMOVE":
                # A message arrived, or the wait timed out: fetch at the next poll either way
                # (priority sub-lists and the other queues are only looked at by a fetch).
                self._kill_safe_hot = True
                raise Empty()
            return self._kill_safe_deliver(reply)
        finally:
            self._in_poll = None
            # As kombu: the connection is idle now, the moment to flush a re-auth token.
            self._flush_brpop_reauth()

    def _poll_error(self, type: str, **options: Any) -> Any:
        sent = self._kill_safe_sent
        if type != "BRPOP" or sent is None:
            return super()._poll_error(type, **options)
        # A message in this reply is in unacked already, held by this connection: it comes
        # back when the connection's lease runs out, like any message of a worker that went.
        self._kill_safe_sent = None
        return self.client.parse_response(self.client.connection, sent)

    # -- the parts ----------------------------------------------------------------------------

    def _kill_safe_ready(self) -> bool:
        """Whether this channel fetches kill-safe (decided at its first poll)."""
        if self._kill_safe_checked:
            return self._kill_safe_sha is not None
        if not (self.kill_safe_fetch and self.ack_emulation):
            self._kill_safe_checked = True
            return False
        with self.conn_or_acquire() as client:
            try:
                version_text = client.info("server").get("redis_version")
            except self.ResponseError:
                version_text = None  # INFO refused: the version is unknown
            script = script_for(server_version(version_text))
            if script is not None:
                self._kill_safe_sha = client.script_load(script)
                self._kill_safe_script = script
        self._kill_safe_checked = True
        if script is None:
            logger.warning(
                "jobs.fetch.unsafe: the Redis server (version %s) has no BLMOVE (Redis >= "
                "6.2): a worker killed while taking a message can lose it (kombu's BRPOP)",
                version_text or "unknown",
                extra={"event": "jobs.fetch.unsafe", "redis_version": version_text},
            )
        return script is not None

    def _kill_safe_fetch_args(self, queues: Sequence[str]) -> list[Any]:
        prefix = self.global_keyprefix
        of_list = queues_of_lists(queues, self._q_for_pri, self.priority_steps)
        lists: list[str] = []
        acked: list[str] = []
        for key, queue in of_list.items():
            lists.append(key)
            no_ack = queue in self._jobs_no_ack
            acked.append("0" if no_ack else "1")
            if key == queue and not no_ack:
                # A queue's keyed messages rank right after its base list (priority 0).
                lists.append(fair.ring_key(queue, self.sep))
                acked.append("F")
        owner = self.jobs_owner
        keys = [
            *(prefix + key for key in (*lists, self.unacked_key, self.unacked_index_key)),
            liveness.held_key(prefix, owner),
            prefix + liveness.OWNERS_KEY,
            liveness.alive_key(prefix, owner),
        ]
        lease = liveness.lease_ms(float(self.jobs_worker_lease))
        return [self._kill_safe_sha, len(keys), *keys, repr(time.time()), owner, lease, *acked]

    def _kill_safe_reply(self, sent: str, options: dict[str, Any]) -> Any:
        client = self.client
        try:
            return client.parse_response(client.connection, sent, **options)
        except self.connection_errors:
            # As kombu: disconnect, so the next poll reconnects.
            client.connection.disconnect()
            raise
        except NoScriptError:
            self._kill_safe_reload()  # the server restarted or flushed its scripts
            self._kill_safe_hot = True
            raise Empty() from None
        except OutOfMemoryError:
            self._kill_safe_out_of_memory(sent)
            raise Empty() from None

    def _kill_safe_deliver(self, reply: Any) -> bool:
        if not reply:
            self._kill_safe_hot = False  # nothing anywhere: block at the next poll
            raise Empty()
        self._kill_safe_hot = True
        key, item, tag = read_reply(reply, self.global_keyprefix)
        if not self.kill_safe_admit(key, item):
            self._kill_safe_forget(tag)
            raise Empty()
        try:
            payload = loads(bytes_to_str(item))
        except Exception:
            # kombu's error, as before; the entry must not bring the item back to fail again.
            self._kill_safe_forget(tag)
            raise
        queue = key.rsplit(self.sep, 1)[0]
        self._queue_cycle.rotate(queue)
        self.kill_safe_recorded = tag
        try:
            self.connection._deliver(payload, queue)
        finally:
            self.kill_safe_recorded = None
        return True

    def _kill_safe_forget(self, tag: str | None) -> None:
        if tag is None:
            return
        with self.conn_or_acquire() as client:
            client.pipeline().zrem(self.unacked_index_key, tag).hdel(
                self.unacked_key, tag
            ).execute()

    def _kill_safe_reload(self) -> None:
        with self.conn_or_acquire() as client:
            self._kill_safe_sha = client.script_load(self._kill_safe_script)

    def _kill_safe_out_of_memory(self, sent: str) -> None:
        self._kill_safe_plain_polls = OOM_PLAIN_POLLS
        self._kill_safe_hot = True
        now = time.monotonic()
        if now - self._kill_safe_oom_warned_at >= OOM_WARNING_INTERVAL_S:
            self._kill_safe_oom_warned_at = now
            logger.warning(
                "jobs.fetch.out_of_memory: the Redis server refused %s (out of memory); "
                "consuming with kombu's BRPOP meanwhile (not kill-safe)",
                sent,
                extra={"event": "jobs.fetch.out_of_memory", "command": sent},
            )
