"""Plumbing shared by the scripted fake servers: the JSON / chunked-stream request handler.

The fakes behave like real servers at the transport level (HTTP/1.1 keep-alive, chunked
streams, TCP_NODELAY as Go and Rust servers set it) so that timings measured against them
are about contemplation, not about the fake.
"""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any


class JsonHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # no 40 ms Nagle stalls on small writes

    def handle(self) -> None:
        try:
            super().handle()
        except (ConnectionResetError, BrokenPipeError):
            return  # the client went away (a cancel, a timeout test): not an error here

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _json(self, status: int, data: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _write_chunk(self, data: bytes) -> None:
        """One chunk of a ``Transfer-Encoding: chunked`` body."""
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _end_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
