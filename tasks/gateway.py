"""A payment gateway on loopback (server + client), for the billing demo and tests.

The server behaves like a real card gateway where it matters: ``POST /charges`` creates a
charge, and a repeat with the same ``Idempotency-Key`` header returns the *first* charge
(header ``Idempotent-Replayed: true``) instead of charging again. ``POST /emails`` is its
receipt mailer, which like most mail APIs dedupes nothing: every call sends. Everything is
recorded (``GET /charges``, ``GET /emails``, ``GET /requests``), so a test can count what
the outside world saw. ``POST /faults {"charges": n}`` makes the next n charge requests
answer 503 *without* charging (a failure before the side effect).
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from jobs_platform import PermanentError, TransientError


class GatewayServer:
    """The gateway, serving from a thread on 127.0.0.1 (port 0: a free one)."""

    def __init__(self, port: int = 0) -> None:
        self.charges: list[dict[str, Any]] = []
        self.emails: list[dict[str, Any]] = []
        #: Every charge request: (idempotency key, HTTP status answered).
        self.requests: list[dict[str, Any]] = []
        self._by_key: dict[str, dict[str, Any]] = {}
        self._faults = 0
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def charge(self, body: dict[str, Any], key: str | None) -> tuple[int, dict[str, Any], bool]:
        """``(status, charge, replayed)``; the check and the record are one atomic step."""
        with self._lock:
            if self._faults > 0:
                self._faults -= 1
                self.requests.append({"key": key, "status": 503})
                return 503, {"error": "gateway busy, nothing charged"}, False
            if key is not None and key in self._by_key:
                self.requests.append({"key": key, "status": 200})
                return 200, self._by_key[key], True
            charge = {
                "id": f"ch_{len(self.charges) + 1}",
                "amount_cents": body.get("amount_cents"),
                "currency": body.get("currency"),
                "reference": body.get("reference"),
                "idempotency_key": key,
            }
            self.charges.append(charge)
            if key is not None:
                self._by_key[key] = charge
            self.requests.append({"key": key, "status": 201})
            return 201, charge, False

    def send_email(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            email = {"id": f"em_{len(self.emails) + 1}", **body}
            self.emails.append(email)
            return email

    def fail_next_charges(self, count: int) -> None:
        with self._lock:
            self._faults = count

    def start(self) -> GatewayServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> GatewayServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _handler(gateway: GatewayServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            listing = {
                "/charges": gateway.charges,
                "/emails": gateway.emails,
                "/requests": gateway.requests,
            }.get(self.path)
            if listing is None:
                self._reply(404, {"error": "not found"})
            else:
                with gateway._lock:
                    self._reply(200, {"items": list(listing)})

        def do_POST(self) -> None:
            body = json.loads(
                self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}"
            )
            if self.path == "/charges":
                status, charge, replayed = gateway.charge(body, self.headers.get("Idempotency-Key"))
                self._reply(status, charge, {"Idempotent-Replayed": "true"} if replayed else {})
            elif self.path == "/emails":
                self._reply(201, gateway.send_email(body))
            elif self.path == "/faults":
                gateway.fail_next_charges(int(body.get("charges", 0)))
                self._reply(200, {"ok": True})
            else:
                self._reply(404, {"error": "not found"})

        def _reply(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:  # keep test and demo output readable
            return

    return Handler


class GatewayClient:
    """The billing app's client. Errors are classified by whether a charge can have happened.

    Refused connections and 429/5xx answers: nothing was charged, so retrying is safe
    (:class:`TransientError`). A read timeout may hide a charge that happened; retrying is
    safe *only* because every charge carries an idempotency key, so it is transient too.
    The original error stays the ``__cause__``, so the receipt mailer's key (run_once) is
    released only when the connection was refused, not after a timeout that may have sent.
    Other 4xx answers will not change: :class:`PermanentError`.
    """

    def __init__(self, base_url: str, *, timeout_s: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    def charge(
        self, *, amount_cents: int, currency: str, reference: str, idempotency_key: str
    ) -> dict[str, Any]:
        return self._post(
            "/charges",
            {"amount_cents": amount_cents, "currency": currency, "reference": reference},
            {"Idempotency-Key": idempotency_key},
        )

    def send_email(self, *, to: str, subject: str, body: str) -> dict[str, Any]:
        return self._post("/emails", {"to": to, "subject": subject, "body": body}, {})

    def list(self, what: str) -> list[dict[str, Any]]:
        """``charges``, ``emails`` or ``requests``: what the gateway recorded."""
        with urllib.request.urlopen(f"{self.base_url}/{what}", timeout=self.timeout_s) as resp:
            return list(json.loads(resp.read())["items"])

    def _post(self, path: str, payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        request = urllib.request.Request(
            self.base_url + path,
            data=json.dumps(payload).encode(),
            method="POST",
            headers={"Content-Type": "application/json", **headers},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return dict(json.loads(response.read()))
        except urllib.error.HTTPError as exc:
            if exc.code in (408, 425, 429) or exc.code >= 500:
                retry_after = exc.headers.get("Retry-After")
                raise TransientError(
                    f"gateway answered HTTP {exc.code} on {path}",
                    retry_after_s=float(retry_after) if retry_after else None,
                ) from None
            raise PermanentError(f"gateway refused {path}: HTTP {exc.code}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            # ``from exc``: IdempotencyKeys.run_once reads the cause to tell a refused
            # connection (nothing sent: release the key) from a read timeout (maybe sent).
            raise TransientError(f"gateway unreachable on {path}: {exc}") from exc
