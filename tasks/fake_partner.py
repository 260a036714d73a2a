"""A scripted partner API on loopback, for the demo and tests (never a real network).

Accounts (``POST /accounts/<id>``), by id: 1 answers 200; 2 answers 503 with
``Retry-After: 1`` once, then 200; 3 answers 404 (a permanent error); 4 answers 503 (retries
run out) until :meth:`FakePartner.heal` fixes it.

Shipments (``POST /shipments/<order>``, the shipping partner of the demo's outage step):
200, except during an outage (:meth:`FakePartner.outage`), when every call answers 503.
Each call is recorded with its ``Idempotency-Key`` (the job's id), its answer and when.

Every request is recorded so a caller can count what the partner saw.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclasses.dataclass(frozen=True)
class Shipment:
    """One shipment call as the partner saw it."""

    order: int
    #: The caller's ``Idempotency-Key`` header: the job's id.
    key: str
    status: int
    at: float


class FakePartner:
    def __init__(self) -> None:
        self.requests: list[int] = []
        self.healed: set[int] = set()
        self.shipments: list[Shipment] = []
        #: Until this time (``time.time()``) every shipment call answers 503.
        self.down_until = 0.0
        self._lock = threading.Lock()
        partner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                account = int(self.path.rstrip("/").rsplit("/", 1)[-1])
                if self.path.startswith("/shipments/"):
                    key = self.headers.get("Idempotency-Key") or ""
                    status, headers = partner.ship(account, key), {}
                else:
                    status, headers = partner.answer(account)
                body = json.dumps({"account_id": account, "status": status}).encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:  # keep the demo output readable
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def answer(self, account: int) -> tuple[int, dict[str, str]]:
        with self._lock:
            self.requests.append(account)
            seen = self.requests.count(account)
        if account == 2 and seen == 1:
            return 503, {"Retry-After": "1"}
        if account == 3:
            return 404, {}
        if account == 4 and account not in self.healed:
            return 503, {}
        return 200, {}

    def ship(self, order: int, key: str) -> int:
        """A shipment call's answer (503 during an outage), recorded."""
        now = time.time()
        status = 503 if now < self.down_until else 200
        with self._lock:
            self.shipments.append(Shipment(order, key, status, now))
        return status

    def outage(self, seconds: float) -> float:
        """Every shipment call answers 503 for ``seconds`` from now; when it ends."""
        self.down_until = time.time() + seconds
        return self.down_until

    def heal(self, account: int) -> None:
        """ "Fix the cause" on the partner's side, so a replay can succeed."""
        with self._lock:
            self.healed.add(account)

    def __enter__(self) -> FakePartner:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
