"""Bad input in a queue list: recorded as a ``poison`` dead letter, never fatal to a worker.

kombu's Redis transport pops an item, parses it and indexes it as a message envelope
without checking it, and Celery's consumer then reads the task protocol the same way. So
bad input either stops the worker ("Unrecoverable error": not JSON, JSON cut short, a body
that does not decode) or looks like a lost broker connection (``KeyError`` is one of
kombu's connection errors): the worker reconnects, and the item is gone or, once it is
unacknowledged, comes back for ever. :class:`PoisonGuardChannel` closes both doors:

1. **Items** (before kombu reads them): each reply of ``BRPOP`` (how workers consume) and
   ``RPOP`` (``basic_get``) passes :meth:`~PoisonGuardChannel.jobs_screen` in the
   channel's Redis client, the seam kombu's own key-prefix client uses to rewrite BRPOP
   replies, so none of kombu's read bookkeeping is copied here. An item that is not JSON,
   not an envelope (:func:`.envelope.envelope_problem`), or whose body kombu's codec cannot
   decode is recorded with the whole item as its raw body; kombu sees an empty read.
2. **Messages** (before Celery's consumer gets them): one whose arguments are over
   ``JOBS_MAX_PAYLOAD_BYTES``, or one the consumer fails to read (no task id, arguments
   that are not a list and a dict, a malformed time limit: a ``LookupError``,
   ``TypeError`` or ``ValueError`` out of Celery) is recorded with its body and headers,
   then acknowledged.

Either way the refusal becomes one ``poison`` dead letter
(:mod:`jobs_platform.deadletter.rawpoison`) and the worker reads the next message. Control
broadcasts (fanout queues) are not guarded: kombu already drops an unreadable one.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import dumps as kombu_dumps
from kombu.utils.json import loads as kombu_loads

from jobs_platform.deadletter import envelope, rawpoison
from jobs_platform.deadletter.envelope import Refusal

logger = logging.getLogger("jobs_platform.deadletter")


# -- the Redis client: screened replies --------------------------------------------------------


class ScreenedRedis(redis.Redis):
    """A Redis client whose ``BRPOP``/``RPOP`` replies pass ``jobs_screen(key, item)`` first.

    A refused item reads as "nothing there" (``None``), which kombu treats as an empty poll.
    """

    def __init__(self, *args: Any, jobs_screen: Callable[[Any, bytes], bool], **kwargs: Any):
        self.jobs_screen = jobs_screen
        super().__init__(*args, **kwargs)

    def parse_response(self, connection: Any, command_name: Any, **options: Any) -> Any:
        reply = super().parse_response(connection, command_name, **options)  # type: ignore[no-untyped-call]
        if command_name == "BRPOP" and reply:
            key, item = reply
            return reply if self.jobs_screen(key, item) else None
        return reply

    def execute_command(self, *args: Any, **options: Any) -> Any:
        reply = super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        # RPOP's reply has no key: screened here, where the key is still known.
        if len(args) == 2 and args[0] == "RPOP" and isinstance(reply, bytes | str):
            item = reply.encode("utf-8") if isinstance(reply, str) else reply
            return reply if self.jobs_screen(args[1], item) else None
        return reply


class ScreenedPrefixedRedis(ScreenedRedis, kombu_redis.PrefixedStrictRedis):  # type: ignore[misc]
    """:class:`ScreenedRedis` for a ``global_keyprefix``: kombu strips the prefix first."""


# -- the channel -------------------------------------------------------------------------------


class PoisonGuardChannel(kombu_redis.Channel):  # type: ignore[misc]
    """kombu's Redis channel, refusing items and messages that cannot run (module doc)."""

    def _get_client(self) -> Any:
        super()._get_client()  # kombu's redis-py version check
        screen = self.jobs_screen
        if self.global_keyprefix:
            return functools.partial(
                ScreenedPrefixedRedis, global_keyprefix=self.global_keyprefix, jobs_screen=screen
            )
        return functools.partial(ScreenedRedis, jobs_screen=screen)

    # 1. items

    def jobs_screen(self, key: Any, item: bytes) -> bool:
        """Whether kombu may read ``item`` (popped from list ``key``); else it is recorded."""
        try:
            payload, refusal = self._jobs_inspect(item)
        except Exception:
            # A bug here must not become a worker that refuses everything: kombu as before.
            logger.exception("jobs.dlq.poison_screen_failed: item passed unscreened")
            return True
        if refusal is None:
            return True
        queue = bytes_to_str(key).rsplit(self.sep, 1)[0]
        headers = payload.get("headers") if isinstance(payload, dict) else None
        task_id = headers.get("id") if isinstance(headers, dict) else None
        rawpoison.log_refusal("item", queue, len(item), refusal, task_id)
        rawpoison.record(rawpoison.raw_item_letter, item, queue, payload, refusal, raw=item)
        return False

    def _jobs_inspect(self, item: bytes) -> tuple[Any, Refusal | None]:
        payload = envelope.read_item(item, loads=kombu_loads)
        if isinstance(payload, Refusal):
            return None, payload
        problem = envelope.envelope_problem(payload)
        if problem is not None:
            return payload, Refusal(envelope.NOT_AN_ENVELOPE, problem)
        problem = envelope.body_problem(payload)
        if problem is not None:
            return payload, Refusal(envelope.BAD_BODY_ENCODING, problem)
        try:
            self.Message(payload, channel=self)  # kombu's own reading: decodes the body
        except Exception as exc:
            encoding = payload["properties"].get("body_encoding")
            return payload, Refusal(
                envelope.BAD_BODY_ENCODING,
                f"body does not decode as {encoding!r}: {type(exc).__name__}: {exc}",
            )
        return payload, None

    # 2. messages

    def basic_consume(
        self, queue: str, no_ack: bool, callback: Any, consumer_tag: str, **kwargs: Any
    ) -> Any:
        if queue not in self._fanout_queues:
            callback = self._jobs_guard(callback)
        return super().basic_consume(
            queue, no_ack=no_ack, callback=callback, consumer_tag=consumer_tag, **kwargs
        )

    def _jobs_guard(self, callback: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def guarded(message: Any) -> Any:
            refusal = self._jobs_message_refusal(message)
            if refusal is None:
                try:
                    return callback(message)
                except rawpoison.UNREADABLE_ERRORS as exc:
                    if rawpoison.taken_in(message):
                        raise  # Celery's accounting is half done: its own handling, as before
                    refusal = Refusal(
                        envelope.UNREADABLE_MESSAGE,
                        f"Celery could not read the message: {type(exc).__name__}: {exc}",
                    )
            self._jobs_refuse_message(message, refusal)
            return None

        return guarded

    def _jobs_message_refusal(self, message: Any) -> Refusal | None:
        body = message.body or b""
        if not isinstance(body, bytes):
            return None
        headers = message.headers
        decoded = envelope.decode_body(
            body,
            json_body=message.content_type == rawpoison.JSON and not headers.get("compression"),
            loads=kombu_loads,
        )
        limit = rawpoison.max_payload_bytes()
        size = envelope.oversize(body, decoded, max_bytes=limit, dumps=kombu_dumps)
        if size is not None:
            return Refusal(
                envelope.PAYLOAD_TOO_LARGE,
                f"arguments of {size} bytes are over JOBS_MAX_PAYLOAD_BYTES ({limit} bytes)",
            )
        problem = envelope.task_problem(headers, decoded)
        return None if problem is None else Refusal(envelope.UNREADABLE_MESSAGE, problem)

    def _jobs_refuse_message(self, message: Any, refusal: Refusal) -> None:
        body = message.body if isinstance(message.body, bytes) else b""
        headers = message.headers if isinstance(message.headers, dict) else {}
        queue = (message.delivery_info or {}).get("routing_key")
        rawpoison.log_refusal("message", queue, len(body), refusal, headers.get("id"))
        rawpoison.record(rawpoison.message_letter, message, refusal, raw=body)
        if not message.acknowledged:
            message.ack()
