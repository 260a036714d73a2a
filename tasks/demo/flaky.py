"""The payment gateway as the tour runs it: the reference gateway, made flaky the way real
ones are, and slow enough that a worker can die with a charge in flight.

Per charge reference, a seeded plan says how its first requests go (the same run each time
for the same seed):

- ``busy``: 503 *before* charging (nothing charged; the retry charges);
- ``lost``: charged, then 502, as when the gateway's reply is lost on the way back (the
  retry carries the same ``Idempotency-Key`` and gets the first charge back: no second
  charge).

Every charge that goes through takes a moment (``latency_s``) after it is recorded, before
its reply is sent: :attr:`FlakyGateway.in_flight` counts those, so the tour can SIGKILL a
worker while one of its charges has happened and the worker does not know it yet.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Any

from tasks.gateway import GatewayServer

BUSY, LOST = "busy", "lost"


class FlakyGateway(GatewayServer):
    def __init__(
        self,
        *,
        seed: int,
        busy_p: float = 0.2,
        lost_p: float = 0.1,
        twice_p: float = 0.05,
        latency_s: tuple[float, float] = (0.1, 0.5),
    ) -> None:
        super().__init__()
        self.seed = seed
        self.busy_p, self.lost_p, self.twice_p = busy_p, lost_p, twice_p
        self.latency_s = latency_s
        self._plans: dict[str, list[str]] = {}
        self._in_flight = 0
        self._flight_lock = threading.Lock()
        #: What each charge request was answered: charged, replayed, busy, lost.
        self.answers: Counter[str] = Counter()
        # A worker killed mid-request leaves its socket closed: that is the point, not news.
        self.server.handle_error = lambda request, client_address: None  # type: ignore[method-assign]

    @property
    def in_flight(self) -> int:
        """Charges recorded whose reply has not been sent yet."""
        return self._in_flight

    def _plan(self, reference: str) -> list[str]:
        with self._lock:
            if reference not in self._plans:
                rng = random.Random(f"{self.seed}:{reference}")
                draw = rng.random()
                if draw < self.twice_p:
                    plan = [BUSY, BUSY]
                elif draw < self.twice_p + self.busy_p:
                    plan = [BUSY]
                elif draw < self.twice_p + self.busy_p + self.lost_p:
                    plan = [LOST]
                else:
                    plan = []
                self._plans[reference] = plan
            plan = self._plans[reference]
            return [plan.pop(0)] if plan else []

    def charge(self, body: dict[str, Any], key: str | None) -> tuple[int, dict[str, Any], bool]:
        step = self._plan(str(body.get("reference")))
        pause = random.uniform(*self.latency_s)
        if step == [BUSY]:
            time.sleep(pause / 2)
            with self._lock:
                self.requests.append({"key": key, "status": 503})
                self.answers["busy"] += 1
            return 503, {"error": "gateway busy, nothing charged"}, False
        status, charge, replayed = super().charge(body, key)
        with self._flight_lock:
            self._in_flight += 1
        try:
            time.sleep(pause)  # charged; the reply is still on its way
        finally:
            with self._flight_lock:
                self._in_flight -= 1
        with self._lock:
            if step == [LOST] and status == 201:
                self.answers["lost"] += 1
                return 502, {"error": "upstream timeout (the charge went through)"}, False
            self.answers[
                "replayed" if replayed else "charged" if status == 201 else str(status)
            ] += 1
        return status, charge, replayed
