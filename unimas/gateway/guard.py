"""What every gateway request passes before a route sees it, so that no request can hurt the run.

An ASGI middleware (:class:`Guard`) around the whole app:

* **Host** — a request whose ``Host`` header names neither a loopback name
  or address (``localhost``, ``127.0.0.1`` and the rest of 127/8, ``::1``,
  with or without a port) nor the host the server was told to listen on is
  refused with 400 ``invalid_host``: a web page the trainer's browser opens
  cannot reach the loopback port through a DNS name it rebinds to
  127.0.0.1. A server listening on a wildcard address (``0.0.0.0``,
  ``::``) is reached by any name; there the API key is the protection.
* **Body size** — a ``Content-Length`` over the limit is refused with 413
  before any of the body is read; a body without one (chunked) is counted
  as it arrives and refused the moment it passes the limit. The server
  reads a body only as fast as the route consumes it, so a huge body never
  sits in memory.
* **A client that goes away** while its body is read is not answered
  (there is nobody to answer) nor logged as a failure.
* **Anything else** — an exception no route turned into an answer becomes
  a 500 OpenAI-style error for that request alone (logged with its
  traceback); the server, the episode's loop and the run go on.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from typing import Any, Awaitable, Callable

from starlette.requests import ClientDisconnect

from unimas.gateway.errors import GatewayError

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host.lower() == "localhost"


def allowed_hosts(bind: str) -> frozenset[str] | None:
    """Host names accepted besides loopback for a server bound to ``bind`` (None: any, a wildcard bind)."""
    try:
        if ipaddress.ip_address(bind).is_unspecified:
            return None
    except ValueError:
        pass
    return frozenset() if is_loopback(bind) else frozenset({bind.lower()})


def host_name(header: str) -> str:
    """``Host`` header -> the host alone: ``[::1]:80`` -> ``::1``, ``localhost:8400`` -> ``localhost``."""
    value = header.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        return value.partition(":")[0]
    return value


async def answer(send: Send, error: GatewayError) -> None:
    body = json.dumps(error.body()).encode()
    await send({"type": "http.response.start", "status": error.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class Guard:
    """``app.add_middleware(Guard, hosts=..., max_body=...)``: see the module docstring."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], hosts: frozenset[str] | None,
                 max_body: int):
        self.app = app
        self.hosts = hosts
        self.max_body = max_body

    def _refusal(self, scope: Scope) -> GatewayError | None:
        headers = {name.lower(): value for name, value in scope.get("headers", [])}
        if self.hosts is not None:
            name = host_name(headers.get(b"host", b"").decode("latin-1"))
            if not (is_loopback(name) or name in self.hosts):
                return GatewayError(400, f"the Host header {name!r} is not a name of this server: use "
                                         f"127.0.0.1 or localhost (DNS rebinding protection)", code="invalid_host")
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_body:
            return self._too_large(f"{int(length)} bytes")
        return None

    def _too_large(self, size: str) -> GatewayError:
        return GatewayError(413, f"request body of {size} is over the gateway's limit of {self.max_body} bytes",
                            code="request_too_large")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            await answer(send, refusal)
            return
        received = 0
        started = False

        async def counted() -> dict[str, Any]:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body:  # the route's exception handler answers it
                    raise self._too_large(f"more than {self.max_body} bytes")
            return message

        async def watched(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except ClientDisconnect:  # the client went away mid-body: nobody to answer, and no fault of the gateway
            return
        except Exception as exc:  # noqa: BLE001 - one request's failure is that request's answer, never the run's
            if not isinstance(exc, GatewayError):
                log.warning("gateway: %s %s failed", scope.get("method"), scope.get("path"), exc_info=exc)
                exc = GatewayError(500, f"the gateway failed on this request: {type(exc).__name__}: {exc}",
                                   code="internal_error")
            if not started:
                await answer(send, exc)
