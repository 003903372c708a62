"""Reaching ``contemplation mcp --http`` from tests: the server on a free port, the token it
demands (read from its 0600 file, as the owner would), the SDK client sending it, and a
proxy that adds it to every request for a client that cannot send a header of its own (the
conformance suite)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from contemplation.faces.mcp.server import token_path
from contemplation.store.layout import Home
from tests.conftest import ROOT, base_env, wait_for
from tests.realpeers import free_port

MAX_HEAD = 64 * 1024  # bytes of one request's head the proxy reads at most


@dataclass
class HttpFace:
    proc: subprocess.Popen[bytes]
    port: int
    token_file: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    @property
    def token(self) -> str:
        return self.token_file.read_text().strip()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=15)


def serve(home: Home, env: dict[str, str] | None = None) -> HttpFace:
    """``contemplation mcp --http`` on a free port, listening (stdout and stderr piped)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "contemplation", "mcp", "--http", str(port)],
        env=env or base_env(home),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )

    def listening() -> bool:
        if proc.poll() is not None:
            raise AssertionError(proc.stderr.read() if proc.stderr else "server exited")
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_for(listening, timeout=15, what="the HTTP MCP server")
    except BaseException:
        proc.kill()
        proc.wait(timeout=15)
        raise
    return HttpFace(proc, port, token_path(home))


@contextlib.asynccontextmanager
async def bearer(url: str, token: str) -> AsyncIterator[object]:
    """A streamable HTTP transport for ``mcp.Client`` that sends ``Authorization: Bearer``."""
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        create_mcp_http_client(headers=headers) as http,
        streamable_http_client(url, http_client=http) as streams,
    ):
        yield streams


# --------------------------------------------------------------------------- the proxy


async def _copy_body(head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The body of the request ``head`` opens: by Content-Length, or chunk by chunk."""
    fields = {}
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        fields[name.strip().lower()] = value.strip().lower()
    if fields.get(b"transfer-encoding") == b"chunked":
        while True:
            size_line = await reader.readuntil(b"\r\n")
            writer.write(size_line)
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                while (trailer := await reader.readuntil(b"\r\n")) != b"\r\n":
                    writer.write(trailer)
                writer.write(b"\r\n")
                return
            writer.write(await reader.readexactly(size + 2))
    length = int(fields.get(b"content-length", b"0") or b"0")
    if length:
        writer.write(await reader.readexactly(length))


class BearerProxy:
    """A loopback TCP proxy that adds ``Authorization: Bearer <token>`` to each request it
    forwards to ``127.0.0.1:port``; everything else (the Host header, the bodies, the event
    streams back) passes byte for byte."""

    def __init__(self, port: int, token: str) -> None:
        self.target = port
        self.header = f"Authorization: Bearer {token}\r\n".encode()
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def __enter__(self) -> BearerProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise AssertionError("the bearer proxy did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        stop = self._stop
        if stop is not None:
            self._loop.call_soon_threadsafe(stop.set)
        self._thread.join(15)

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._client, "127.0.0.1", 0, limit=MAX_HEAD)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        await self._stop.wait()
        server.close()

    async def _client(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            sr, sw = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            cw.close()
            return
        back = asyncio.create_task(self._pipe(sr, cw))
        try:
            while True:
                head = await cr.readuntil(b"\r\n\r\n")  # at most MAX_HEAD
                first, _, rest = head.partition(b"\r\n")
                sw.write(first + b"\r\n" + self.header + rest)
                await _copy_body(head, cr, sw)
                await sw.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
            pass
        finally:
            with contextlib.suppress(OSError):
                sw.close()
            await asyncio.wait({back}, timeout=5)
            back.cancel()
            cw.close()

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while chunk := await src.read(65536):
                dst.write(chunk)
                await dst.drain()
        with contextlib.suppress(OSError):
            dst.close()


@contextlib.contextmanager
def bearer_proxy(face: HttpFace) -> Iterator[BearerProxy]:
    with BearerProxy(face.port, face.token) as proxy:
        yield proxy
