"""The gateway's HTTP routes (FastAPI).

* ``GET  /e/<episode>/v1/models``            the roles, as OpenAI "models"
* ``POST /e/<episode>/v1/chat/completions``  one turn of the role named by ``model``
* ``POST /e/<episode>/v1/responses``         the same turn through the Responses API (``responses``)
* ``POST /e/<episode>/v1/rewards``           ``{"turn": id, "reward": x}`` for one of the episode's turns
* the same without ``/e/<episode>`` when serving a trained team (``unimas serve``)

Every refusal — unknown role, bad body, finished episode, wrong token,
unknown path — is an OpenAI-style ``{"error": {...}}`` body, so clients
raise their usual exceptions and the run carries on. Before any route, the
:class:`~unimas.gateway.guard.Guard` checks the Host header and the body
size and turns any unexpected exception into that request's 500.
"""

from __future__ import annotations

import hmac
import secrets
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from unimas.gateway.guard import Guard
from unimas.gateway.protocol import (MAX_REQUEST_BYTES, GatewayError, completion, model_list, parse_chat,
                                     parse_json, stream_events)
from unimas.gateway.responses import parse_responses, response_events, response_object, response_shell
from unimas.gateway.sessions import Episode, Serving
from unimas.gateway.streaming import TurnStream
from unimas.trajectory import TurnNode

Lookup = Callable[[str | None], "Episode | Serving"]
"""Episode key (None: the plain ``/v1`` prefix) -> its session; raises GatewayError(404) when there is none."""


def id_prefix(session: Episode | Serving) -> str:
    """What a completion or response id puts before the turn id, so that ids never repeat within a session.

    An episode's turn ids are unique within it: its key is the prefix. A served request is a one-turn episode
    of its own, whose turn id is always ``<role>#0``: without a fresh random prefix every answer would share
    one id, and a ``previous_response_id`` would continue whichever client's conversation was answered last.
    """
    return f"{session.key}:" if isinstance(session, Episode) else f"{secrets.token_hex(8)}:"


def build_app(lookup: Lookup, roles: list[str], token: str | None, hosts: frozenset[str] | None = None,
              episode_token: Callable[[str], str | None] | None = None) -> FastAPI:
    """``token``: the bearer token every request must carry (None = no check: loopback only).

    ``hosts``: ``Host`` names accepted besides loopback (None: any; see :mod:`unimas.gateway.guard`).
    ``episode_token``: episode key -> the token that episode's requests must carry (None: not checked).
    """
    app = FastAPI(title="unimas gateway", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(Guard, hosts=hosts, max_body=MAX_REQUEST_BYTES)

    @app.exception_handler(GatewayError)
    async def _refused(request: Request, exc: GatewayError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        code = "method_not_allowed" if exc.status_code == 405 else "not_found"
        error = GatewayError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", code=code)
        return JSONResponse(error.body(), status_code=exc.status_code)

    def checked(request: Request, key: str | None) -> Episode | Serving:
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if token is not None and not hmac.compare_digest(given.encode(), token.encode()):
            raise GatewayError(401, "missing or wrong API key: use the run's token (OPENAI_API_KEY of the "
                                    "agent)", code="invalid_api_key")
        session = lookup(key)
        if key is not None and episode_token is not None:
            expected = episode_token(key) or ""  # read after the lookup: a closing episode's is gone, so refused
            if not expected or not hmac.compare_digest(given.encode(), expected.encode()):
                raise GatewayError(401, "missing or wrong API key for this episode: send the OPENAI_API_KEY unimas "
                                        "gave this episode's agent (a framework that takes the key from its own "
                                        "settings needs it there, e.g. Agent Lightning's LLM(..., "
                                        "api_key=os.environ['OPENAI_API_KEY']): docs/gateway.md)",
                                   code="invalid_api_key")
        return session

    async def models(request: Request, key: str | None = None) -> dict:
        checked(request, key)
        return model_list(roles)

    async def chat(request: Request, key: str | None = None) -> dict | StreamingResponse:
        session = checked(request, key)
        call = parse_chat(parse_json(await request.body()), set(roles), sampling=isinstance(session, Serving))
        prefix = id_prefix(session)

        def answer(turn: TurnNode) -> dict:
            return completion(turn, f"chatcmpl-{prefix}{turn.id}", tools=bool(call.tools), call=call)

        if not call.stream:
            return answer(await session.chat(call))
        stream = TurnStream()
        await stream.open(session.chat(call, progress=stream))  # a refusal is still answered with its status
        events = stream_events(stream, call, answer, f"chatcmpl-{prefix}{stream.turn_id}")
        return StreamingResponse(events, media_type="text/event-stream")

    async def responses(request: Request, key: str | None = None) -> dict | StreamingResponse:
        session = checked(request, key)
        body = parse_json(await request.body())
        call = parse_responses(body, set(roles), isinstance(session, Serving), session.responses)
        prefix = id_prefix(session)

        def answer(turn: TurnNode) -> dict:
            return response_object(turn, call, f"resp-{prefix}{turn.id}", session.responses, body)

        if not call.stream:
            return answer(await session.chat(call))
        stream = TurnStream()
        await stream.open(session.chat(call, progress=stream))
        shell = response_shell(call, f"resp-{prefix}{stream.turn_id}", body)
        return StreamingResponse(response_events(stream, call, shell, answer), media_type="text/event-stream")

    async def reward(request: Request, key: str) -> dict:
        session = checked(request, key)
        return session.post_reward(parse_json(await request.body()))

    async def metric(request: Request, key: str) -> dict:
        session = checked(request, key)
        return session.post_metric(parse_json(await request.body()))

    for prefix in ("/e/{key}/v1", "/v1"):
        app.add_api_route(f"{prefix}/models", models, methods=["GET"])
        app.add_api_route(f"{prefix}/chat/completions", chat, methods=["POST"], response_model=None)
        app.add_api_route(f"{prefix}/responses", responses, methods=["POST"], response_model=None)
    app.add_api_route("/e/{key}/v1/rewards", reward, methods=["POST"])
    app.add_api_route("/e/{key}/v1/metrics", metric, methods=["POST"])
    return app
