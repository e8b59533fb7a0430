"""The one exception of the gateway: a refused request, answered as an OpenAI-style error body."""

from __future__ import annotations

from typing import Any


class GatewayError(Exception):
    """A refused request: becomes ``{"error": {...}}`` with this HTTP status."""

    def __init__(self, status: int, message: str, code: str = "invalid_request", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}
