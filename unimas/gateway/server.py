"""The gateway's web server: uvicorn on its own thread, and the table of open episodes.

The server outlives the trainer's event loops (training, evaluation and
``unimas eval`` each run their own), so it gets a thread and a loop of its
own and is started once, at the first episode. Episodes register while they
run; a request for any other key is an OpenAI-style 404.

In a ``sealed`` server (a ``command`` agent's) each episode also gets a
random bearer token of its own, handed to its agent as ``OPENAI_API_KEY`` and required on
its routes (401 otherwise). It is not derived from the URL, so an agent that
learns a sibling's base URL still cannot act in that episode. Requests whose
``Host`` header names neither loopback nor the configured host are refused
(DNS rebinding; :mod:`unimas.gateway.guard`).
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import threading
from contextlib import contextmanager
from typing import Iterator, Mapping

import uvicorn

from unimas.config.schema import RoleConfig
from unimas.controller.context import EpisodeContext
from unimas.errors import UserError
from unimas.gateway.app import build_app
from unimas.gateway.guard import allowed_hosts, is_loopback  # noqa: F401 - is_loopback: also imported from here
from unimas.gateway.protocol import GatewayError
from unimas.gateway.sessions import Episode, IgnoredFields


def free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


class GatewayServer:
    """One per run: serves ``/e/<episode>/v1`` for every running episode of the run."""

    def __init__(self, roles: Mapping[str, RoleConfig], host: str = "127.0.0.1", port: int = 0, sealed: bool = True):
        """``sealed``: every episode's requests must carry its own token (agents outside the trainer's process)."""
        self.roles = roles
        self.host = host
        self.port = port
        self.sealed = sealed
        self._episodes: dict[str, Episode] = {}
        self._tokens: dict[str, str] = {}
        """Episode key -> the bearer token its requests must carry (sealed episodes only)."""
        self.ignored = IgnoredFields()
        """The run's record of ignored request fields: each (role, field) is printed once per run."""
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _lookup(self, key: str | None) -> Episode:
        episode = self._episodes.get(key or "")
        if episode is None:
            raise GatewayError(404, "no running episode at this URL (it finished, or the key is wrong): use the "
                                    "OPENAI_BASE_URL unimas gave the agent", code="episode_not_found")
        return episode

    def start(self) -> None:
        """Start serving (once; later calls return at once). Blocks until the port accepts connections."""
        with self._lock:
            if self._thread is not None:
                return
            try:
                self.port = self.port or free_port(self.host)
            except OSError as exc:
                raise UserError(f"the gateway cannot listen on {self.host}: {exc}", where="workflow.agent.host") \
                    from None
            app = build_app(self._lookup, sorted(self.roles), token=None, hosts=allowed_hosts(self.host),
                            episode_token=self._tokens.get if self.sealed else None)
            config = uvicorn.Config(app, host=self.host, port=self.port, log_level="warning", access_log=False,
                                    lifespan="off")
            self._server = uvicorn.Server(config)
            self._thread = threading.Thread(target=self._server.run, name="unimas-gateway", daemon=True)
            self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise UserError(f"the gateway could not start on {self.url} (port in use?)",
                                where="workflow.agent.port")
            self._thread.join(0.01)

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(10)
            self._server = self._thread = None

    @contextmanager
    def episode(self, context: EpisodeContext) -> Iterator[Episode]:
        """Open the episode's door for the duration of the block; its base URL is ``base_url(episode)``."""
        self.start()
        episode = Episode(context, self.roles, asyncio.get_running_loop(), self.ignored)
        if self.sealed:
            self._tokens[episode.key] = secrets.token_urlsafe(32)
        self._episodes[episode.key] = episode
        try:
            yield episode
        finally:
            episode.close()
            del self._episodes[episode.key]
            self._tokens.pop(episode.key, None)

    def token(self, episode: Episode) -> str:
        """The sealed episode's bearer token (its agent's ``OPENAI_API_KEY``)."""
        return self._tokens[episode.key]

    def base_url(self, episode: Episode) -> str:
        return f"{self.url}/e/{episode.key}/v1"
