"""The backends' one HTTP client: a keep-alive pool per server, and every transport failure
turned into a :class:`~contemplation.errors.BackendError` here, so no backend sees the library.

It is aiohttp, not httpx. Measured on loopback (bench/bench_http_client.py): a streamed
``/api/chat`` reply of a dozen lines costs the client about 1.0 ms of CPU through httpx
(httpx, httpcore, h11 and anyio, each a thin slice) and 0.35 ms through aiohttp, whose parser
is in C. Against an instant server that difference was half of the daemon's work per turn.

Choices that differ from the library's defaults, on purpose:
* proxies come from the environment once (``HTTP(S)_PROXY``, ``NO_PROXY``), and a loopback
  server is never reached through one; ``~/.netrc`` is not read on every request;
* redirects are not followed (a model server that redirects a POST is misconfigured);
* a body read whole is capped (``max_body``), so a server cannot fill memory with one answer;
* no cookie jar: no model API here uses cookies.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

import structlog

from contemplation.base.redact import credentials, redacted
from contemplation.errors import BackendError, ConfigError, ErrorKind

if TYPE_CHECKING:  # aiohttp costs ~110 ms to import: it comes when a request is first made,
    # so the backend modules (and the settings models they declare) cost a command nothing
    import aiohttp
    from multidict import CIMultiDictProxy

MAX_BODY = 32 * 1024 * 1024  # a whole (non-streamed) answer; OpenCode's replies are the largest


def preload() -> None:
    """Import aiohttp now: the daemon does at start, so its first turn does not wait ~100 ms
    for it (a command that never sends a request never does)."""
    import aiohttp  # noqa: F401


def is_loopback(host: str) -> bool:
    """A host name or address that is this machine (``localhost`` and its subdomains, a
    loopback address, bracketed or not)."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def proxy_for(url: str) -> str | None:
    """The proxy the environment names for ``url``, or None (loopback never goes through one)."""
    parsed = urllib.parse.urlsplit(url)
    host = parsed.hostname or ""
    if not host or is_loopback(host) or urllib.request.proxy_bypass(host):
        return None
    return urllib.request.getproxies().get(parsed.scheme)


log = structlog.get_logger("contemplation.http")


def _in_words(exc: BaseException) -> str:
    """What a transport failure means, for a person (a line in messages.log): the client's
    own exception text ("TransferEncodingError: 400, ..." where 400 is no HTTP status) is
    for the daemon's log."""
    import aiohttp

    if isinstance(exc, aiohttp.ClientPayloadError | aiohttp.ServerDisconnectedError):
        return "the server closed the connection in the middle of the reply"
    if isinstance(exc, ConnectionResetError):
        return "the connection was reset in the middle of the reply"
    return "the connection broke in the middle of the reply"


def failure(exc: BaseException, url: str) -> BackendError:
    """A transport failure (no HTTP answer) as a transient :class:`BackendError`."""
    import aiohttp

    url = redacted(url)
    if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError):
        return BackendError(
            f"cannot reach {url}: {exc or type(exc).__name__}",
            transient=True,
            kind=ErrorKind.UNREACHABLE,
        )
    if isinstance(exc, TimeoutError):
        return BackendError(f"timed out talking to {url}", transient=True, kind=ErrorKind.TIMEOUT)
    log.warning("connection_failed", url=url, error=redacted(f"{type(exc).__name__}: {exc}"))
    words = _in_words(exc).removesuffix(" in the middle of the reply")
    return BackendError(
        f"connection to {url} failed: {words}", transient=True, kind=ErrorKind.CONNECTION
    )


class Reply:
    """A whole answer: status, headers and the body (at most ``max_body`` bytes)."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        """The body as JSON; ``ValueError`` when it is not."""
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


class Stream:
    """An answer whose headers have arrived and whose body is read as it comes."""

    __slots__ = ("_resp", "headers", "status")

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status
        self.headers: CIMultiDictProxy[str] = resp.headers

    async def chunks(self, what: str) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive; a connection that breaks first is a CUT."""
        import aiohttp

        try:
            async for chunk in self._resp.content.iter_any():
                yield chunk
        except (aiohttp.ClientError, OSError) as exc:
            error = redacted(f"{type(exc).__name__}: {exc}")
            log.warning("stream_cut", what=what, error=error)  # the detail: the log's only
            raise BackendError(
                f"{what}: {_in_words(exc)}", transient=True, kind=ErrorKind.CUT
            ) from exc

    async def read(self, limit: int = 64 * 1024, within: float = 10.0) -> bytes:
        """At most ``limit`` bytes of the body (for an error answer), whatever came within
        ``within`` s: a server that sends an error's headers and then stalls cannot hold the
        turn. Never raises (TimeoutError is an OSError)."""
        import aiohttp

        out = bytearray()
        with contextlib.suppress(aiohttp.ClientError, OSError):
            async with asyncio.timeout(within):
                while len(out) < limit:
                    chunk = await self._resp.content.read(limit - len(out))
                    if not chunk:
                        break
                    out += chunk
        return bytes(out)

    def close(self) -> None:
        """Give the connection back to the pool when the body was read to its end, else close
        it (a half-read body cannot be reused)."""
        self._resp.release()


class Http:
    """One server's client. The aiohttp session is made on first use, in the running loop
    (and again if a later ``asyncio.run`` brings another loop)."""

    def __init__(
        self,
        base_url: str,
        *,
        connect: float,
        headers: Mapping[str, str] | None = None,
        auth: tuple[str, str] | None = None,
        max_body: int = MAX_BODY,
    ) -> None:
        self.base_url, in_url = credentials(base_url.rstrip("/"))
        self.connect = connect
        self.max_body = max_body
        self.headers = {"User-Agent": "contemplation", **(headers or {})}
        if in_url is not None and (auth is not None or "Authorization" in self.headers):
            raise ConfigError(
                f"{redacted(base_url)} carries a password and another one is set: use one"
            )
        auth = auth or in_url  # never kept in the URL: every error text names base_url
        if auth is not None:
            import aiohttp

            self.headers["Authorization"] = aiohttp.encode_basic_auth(*auth)
        self.proxy = proxy_for(self.base_url)
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def url(self, path: str) -> str:
        if "://" in path:  # absolute: the server's root beside its API (llama-server /props)
            return path
        return f"{self.base_url}/{path.lstrip('/')}"

    def _client(self) -> aiohttp.ClientSession:
        import aiohttp

        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers=self.headers,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect),
                cookie_jar=aiohttp.DummyCookieJar(),
                trust_env=False,
            )
            self._loop = loop
        return self._session

    async def _send(
        self,
        method: str,
        path: str,
        body: Any,
        params: Mapping[str, str | int] | None,
        *,
        resend: bool,
    ) -> aiohttp.ClientResponse:
        import aiohttp

        kwargs: dict[str, Any] = {"allow_redirects": False, "proxy": self.proxy}
        if body is not None:
            kwargs["data"] = json.dumps(
                body, ensure_ascii=False, separators=(",", ":"), allow_nan=False
            ).encode()
            kwargs["headers"] = {"Content-Type": "application/json"}
        if params:
            kwargs["params"] = {k: str(v) for k, v in params.items()}
        session, url = self._client(), self.url(path)
        try:
            return await session.request(method, url, **kwargs)
        except aiohttp.ClientConnectorError:
            raise  # nobody listening: a second try would only fail twice
        except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError):
            if not resend:
                raise
        # A kept-alive connection the server closed an instant before: llama.cpp's server
        # closes it after the last chunk of a stream, and aiohttp (which, unlike httpcore,
        # does not poll a pooled socket before reusing it) learns of that only on the loop's
        # next pass, so a request sent right after a reply found it closing half the time.
        # aiohttp resends only idempotent methods; the caller says this POST is harmless twice.
        return await session.request(method, url, **kwargs)

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str | int] | None = None,
        within: float,
        late: str = "",
        resend: bool = False,
    ) -> Reply:
        """Send and read the whole answer within ``within`` s (``late`` says what took too
        long). Any HTTP status is an answer; no answer at all is a :class:`BackendError`.
        ``resend``: a POST that changes nothing on the server, sent once more when the kept-
        alive connection it went out on turns out closed (other methods always are)."""
        late = late or f"{self.base_url} did not answer {method} {path} within {within:g} s"
        async with self._answered(within, late):
            resp = await self._send(method, path, json, params, resend=resend)
            try:
                body = await self._body(resp)
            finally:
                resp.release()
        return Reply(resp.status, resp.headers, body)

    @contextlib.asynccontextmanager
    async def _answered(self, within: float, late: str) -> AsyncIterator[None]:
        """The block's deadline (``late`` says what was late), and every transport failure in
        it as a :class:`BackendError`."""
        import aiohttp

        try:
            async with asyncio.timeout(within):
                yield
        except TimeoutError as exc:  # ours, or aiohttp's connect timeout (a ClientError too)
            if isinstance(exc, aiohttp.ClientError):
                raise failure(exc, self.base_url) from exc
            raise BackendError(late, transient=True, kind=ErrorKind.TIMEOUT) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise failure(exc, self.base_url) from exc

    async def _body(self, resp: aiohttp.ClientResponse) -> bytes:
        if (resp.content_length or 0) > self.max_body:
            raise self._too_large(resp.content_length or 0)
        out = bytearray()
        async for chunk in resp.content.iter_any():
            out += chunk
            if len(out) > self.max_body:
                raise self._too_large(len(out))
        return bytes(out)

    def _too_large(self, size: int) -> BackendError:
        return BackendError(
            f"{self.base_url} sent an answer of more than {self.max_body} bytes ({size})",
            transient=False,
            kind=ErrorKind.TOO_LARGE,
        )

    async def stream(self, path: str, body: Any, *, first_byte: float, silent: str) -> Stream:
        """POST ``body`` and wait at most ``first_byte`` s for the answer's headers (a cold
        model load sends none until it is loaded); ``silent`` names who kept quiet. The
        streamed chat APIs keep no state per request, so a closed connection is resent on."""
        async with self._answered(first_byte, f"{silent} sent nothing for {first_byte:g} s"):
            resp = await self._send("POST", path, body, None, resend=True)
        return Stream(resp)

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None and not session.closed:
            with contextlib.suppress(RuntimeError):  # its loop is gone: nothing left to close
                await session.close()
