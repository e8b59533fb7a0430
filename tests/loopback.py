"""A loopback OpenAI-style server for tests: each POST is answered with one choice computed from its body.

Binds 127.0.0.1 on a free port and stops when the ``with`` block ends.
"""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator

Answer = Callable[[str, dict[str, Any]], dict[str, Any]]
"""(request path, JSON body) -> the response's single ``choices`` entry."""


class _Server(ThreadingHTTPServer):
    request_queue_size = 128


@contextmanager
def completions_server(answer: Answer) -> Iterator[str]:
    """Serve ``answer`` and yield the base URL (``http://127.0.0.1:PORT``)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server naming
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            payload = json.dumps({"choices": [answer(self.path, body)]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = _Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
