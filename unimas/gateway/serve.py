"""``unimas serve CONFIG --checkpoint DIR``: the trained team behind the same OpenAI-compatible API.

The agent code that was trained runs unchanged against it: ``model`` still
names the role, and each role answers with the weights (and LoRA adapter)
the checkpoint holds for it. Nothing is recorded or trained; requests may
set ``temperature`` and ``top_p``, and ``max_tokens`` up to the role's
``generation.max_new_tokens`` (a larger one is lowered to it, as in
training). The server runs on this process's event loop, where the router
batches requests that arrive together. It answers only requests whose
``Host`` is loopback or ``--host`` (:mod:`unimas.gateway.guard`).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
from pathlib import Path

import uvicorn

from unimas.config.schema import ExperimentConfig
from unimas.contract.registry import Registry
from unimas.controller.router import Router
from unimas.errors import UserError
from unimas.gateway.app import build_app
from unimas.gateway.guard import allowed_hosts, is_loopback
from unimas.gateway.protocol import GatewayError
from unimas.gateway.sessions import Serving
from unimas.output import checkpoints
from unimas.output.rundir import RunDir
from unimas.runtime.transport import start_transport

TOKEN_ENV = "UNIMAS_SERVE_TOKEN"
"""The API key clients must send when the server listens beyond loopback (generated when unset)."""


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket already bound and listening on ``host:port`` (0: a free port), handed to uvicorn.

    Bound before the address is printed, so a client that reads it and connects at once is queued by the kernel
    rather than refused while the server starts (and a free port cannot be taken between choosing and binding it).
    """
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    listener = socket.socket(family, kind, proto)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(address)
        listener.listen(2048)
    except OSError as exc:
        listener.close()
        raise UserError(f"cannot listen on {host}:{port}: {exc}", where="--host/--port") from None
    return listener


def serve_token(host: str, environ: dict[str, str] | None = None) -> str | None:
    """None on loopback (only this machine can connect); otherwise ``$UNIMAS_SERVE_TOKEN`` or a fresh token."""
    if is_loopback(host):
        return None
    given = (os.environ if environ is None else environ).get(TOKEN_ENV, "")
    return given or secrets.token_urlsafe(24)


async def serve(config: ExperimentConfig, registry: Registry, checkpoint: Path | None, host: str = "127.0.0.1",
                port: int = 0) -> None:
    """Load ``checkpoint`` (None: the config's initial weights) and answer requests until interrupted."""
    if checkpoint is not None and not RunDir.is_complete(checkpoint):
        raise UserError("not a complete unimas checkpoint (no COMPLETE marker)", where=str(checkpoint))
    transport = start_transport(config, registry)
    try:
        if checkpoint is not None:
            if (checkpoint / checkpoints.MANIFEST).exists():
                checkpoints.verify(checkpoint)
            await asyncio.gather(*(transport.load(g, checkpoint / g) for g in sorted(config.models)))
        runtime = config.runtime
        serving = Serving(config.roles, Router(transport, runtime.max_batch_size, runtime.max_wait_ms / 1000))

        def lookup(key: str | None) -> Serving:
            if key is not None:
                raise GatewayError(404, "this server has no episodes: use the base URL /v1", code="not_found")
            return serving

        listener = listening_socket(host, port)
        port = listener.getsockname()[1]
        token = serve_token(host)
        app = build_app(lookup, sorted(config.roles), token=token, hosts=allowed_hosts(host))
        server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off"))
        print(f"serving roles {', '.join(sorted(config.roles))} at http://{host}:{port}/v1", flush=True)
        if token is not None and not os.environ.get(TOKEN_ENV):
            print(f"API key (clients send it as OPENAI_API_KEY): {token}", flush=True)
        await server.serve(sockets=[listener])
    finally:
        transport.shutdown()
