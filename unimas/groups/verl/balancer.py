"""Which of a served verl group's server replicas answers a generation request.

verl's ``LLMServerManager`` starts a routing actor so that many clients (its
agent-loop workers) share one table of in-flight requests. A unimas group has
exactly one client, in the group's own process, so the table lives there:
:class:`RequestRouter` is a plain object the group's client asks
(:class:`unimas.groups.verl.servers.RoutedClient`). That saves an actor per
group whose start imported verl's package (torch, tensordict, transformers:
about 4 CPU-seconds and 500 MB each) and two remote calls per request.

Routing: a request id seen before goes to the server that served it (a
multi-turn conversation keeps its prefix cache), any other to the server with
the fewest requests in flight, the first registered on a tie. What a server
samples does not depend on the choice: unimas seeds every request itself
(:class:`unimas.groups.verl.servers.ServerRollout`).
"""

from __future__ import annotations

import threading
from typing import Any

from cachetools import LRUCache

DEFAULT_REMEMBERED_REQUESTS = 10_000
"""How many request ids keep their server (least recently used forgotten first)."""


class RequestRouter:
    """Least in-flight requests, sticky per request id; safe to call from several threads."""

    def __init__(self, servers: dict[str, Any], remember: int = DEFAULT_REMEMBERED_REQUESTS):
        if not servers:
            raise ValueError("a request router needs at least one server")
        self._handles = dict(servers)
        self._in_flight = {server_id: 0 for server_id in servers}
        self._remembered: LRUCache[str, str] = LRUCache(maxsize=max(1, int(remember)))
        self._lock = threading.Lock()

    def acquire_server(self, request_id: str) -> tuple[str, Any]:
        """``(server_id, handle)`` for the request, counted in flight until :meth:`release_server`."""
        with self._lock:
            server_id = self._remembered.get(request_id)  # a hit counts as a use
            if server_id is None:
                server_id = min(self._in_flight, key=self._in_flight.__getitem__)  # first registered on a tie
                self._remembered[request_id] = server_id  # forgets the least recently used when full
            self._in_flight[server_id] += 1
            return server_id, self._handles[server_id]

    def release_server(self, server_id: str) -> None:
        with self._lock:
            if self._in_flight.get(server_id, 0) > 0:
                self._in_flight[server_id] -= 1

    def in_flight(self) -> dict[str, int]:
        """Requests each server has not answered yet."""
        with self._lock:
            return dict(self._in_flight)
