"""A scripted ``opencode serve`` (v1 API) on loopback, in the shapes OpenCode 1.18.33 sends.

Shapes are copied from the real captures in the reference fixtures
(``opencode-prompt-response.json``, the OpenAPI spec) and llm-server-apis.md §4.2: errors are
``{"name": ..., "data": {"message": ...}}``; a failed model call is a 200 with ``info.error``;
an aborted prompt returns ``MessageAbortedError``. It exists for what a real OpenCode cannot be
made to do on demand (upstream failures, a lost session, a 500, a hang until abort, a failed
delete: `delete_status`).
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.fakes.http import JsonHandler


@dataclass
class Step:
    """What ``POST /session/{id}/message`` does.

    kind: reply | http_error | info_error | hang | forget_session
    (forget_session: the session vanishes, as if deleted on the server; answers 404)
    """

    kind: str = "reply"
    text: str | None = None  # default: "Echo: <the prompt text>"
    reasoning: str = ""
    tools: list[str] = field(default_factory=list)  # tool parts OpenCode "ran"
    tokens: dict[str, Any] = field(
        default_factory=lambda: {
            "total": 13, "input": 10, "output": 3, "reasoning": 0, "cache": {"write": 0, "read": 0}
        }
    )  # fmt: skip
    status: int = 500
    body: dict[str, Any] | None = None
    error: dict[str, Any] | None = None  # info.error for kind info_error
    hang_seconds: float = 60.0


class FakeOpenCode:
    def __init__(self, password: str | None = None) -> None:
        self.password = password
        self.sessions: dict[str, dict[str, Any]] = {}
        self.messages: dict[str, list[dict[str, Any]]] = {}  # the prompt bodies
        self.history: dict[str, list[dict[str, Any]]] = {}  # {"info", "parts"}, as GET lists them
        self.delete_status: int | None = None  # set: DELETE /session/{id} fails with it
        self.script: deque[Step] = deque()
        self.requests: list[dict[str, Any]] = []
        self.models = {"local": {"smollm2": {"limit": {"context": 8192, "output": 512}}}}
        self.lock = threading.Lock()
        self.aborted: dict[str, threading.Event] = {}
        self.busy: set[str] = set()
        self.stop_event = threading.Event()
        self._ids = itertools.count(1)
        fake = self

        class Handler(_Handler):
            server_fake = fake

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def start(self) -> FakeOpenCode:
        threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True).start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def enqueue(self, *steps: Step) -> None:
        with self.lock:
            self.script.extend(steps)

    def calls(self, method: str, suffix: str = "") -> list[dict[str, Any]]:
        with self.lock:
            return [
                r for r in self.requests if r["_method"] == method and r["_path"].endswith(suffix)
            ]

    def new_id(self, prefix: str) -> str:
        return f"{prefix}_{next(self._ids):04d}fake"


def _not_found(sid: str) -> dict[str, Any]:
    return {"name": "NotFoundError", "data": {"message": f"Session not found: {sid}"}}


class _Handler(JsonHandler):
    server_fake: FakeOpenCode

    def _authorized(self) -> bool:
        fake = self.server_fake
        if fake.password is None:
            return True
        want = base64.b64encode(f"opencode:{fake.password}".encode()).decode()
        if self.headers.get("Authorization") == f"Basic {want}":
            return True
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="Secure Area"')
        self.send_header("Content-Length", "0")
        self.end_headers()
        return False

    def _record(self, method: str, body: Any = None) -> None:
        fake = self.server_fake
        with fake.lock:
            fake.requests.append({"_method": method, "_path": self.path, "body": body})

    def do_GET(self) -> None:
        self._record("GET")
        if not self._authorized():
            return
        fake = self.server_fake
        path = self.path.split("?")[0]
        if path == "/global/health":
            self._json(200, {"healthy": True, "version": "1.18.33"})
        elif path == "/config/providers":
            providers = [
                {"id": pid, "name": pid, "source": "config", "env": [], "options": {},
                 "models": {mid: {"id": mid, "providerID": pid, **info}
                            for mid, info in models.items()}}
                for pid, models in fake.models.items()
            ]  # fmt: skip
            self._json(200, {"providers": providers, "default": {}})
        elif path.startswith("/session/"):
            parts = path.strip("/").split("/")
            sid = parts[1]
            with fake.lock:
                session = fake.sessions.get(sid)
                listed = list(fake.history.get(sid, []))
            limit = parse_qs(urlsplit(self.path).query).get("limit")
            if session is None:
                self._json(404, _not_found(sid))
            elif parts[2:] == ["message"]:  # the last `limit` messages, oldest first
                self._json(200, listed[-int(limit[0]) :] if limit and int(limit[0]) else listed)
            else:
                self._json(200, session)
        else:
            self._json(404, {"name": "NotFoundError", "data": {"message": "no route"}})

    def do_DELETE(self) -> None:
        self._record("DELETE")
        if not self._authorized():
            return
        fake = self.server_fake
        sid = self.path.split("?")[0].split("/")[2]
        if fake.delete_status is not None:
            self._json(fake.delete_status, {"name": "UnknownError",
                                            "data": {"message": "Unexpected server error."}})  # fmt: skip
            return
        with fake.lock:
            found = fake.sessions.pop(sid, None)
        if found is None:
            self._json(404, _not_found(sid))
        else:
            self._json(200, True)

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n) or b"{}") if n else {}
        self._record("POST", body)
        if not self._authorized():
            return
        fake = self.server_fake
        parts = self.path.split("?")[0].strip("/").split("/")
        if parts == ["session"]:
            sid = fake.new_id("ses")
            session = {
                "id": sid, "slug": "fake", "projectID": "global", "directory": "/tmp",
                "title": body.get("title", ""), "version": "1.18.33",
                "time": {"created": int(time.time() * 1000)},
            }  # fmt: skip
            with fake.lock:
                fake.sessions[sid] = session
                fake.aborted[sid] = threading.Event()
            self._json(200, session)
            return
        if len(parts) == 3 and parts[0] == "session":
            sid, action = parts[1], parts[2]
            with fake.lock:
                known = sid in fake.sessions
            if not known:
                self._json(404, _not_found(sid))
            elif action == "abort":
                fake.aborted[sid].set()
                self._json(200, True)
            elif action == "message":
                self._message(sid, body)
            else:
                self._json(404, {"name": "NotFoundError", "data": {"message": "no route"}})
            return
        self._json(404, {"name": "NotFoundError", "data": {"message": "no route"}})

    def _message(self, sid: str, body: dict[str, Any]) -> None:
        fake = self.server_fake
        if not body.get("parts"):
            self._json(400, {"name": "BadRequest",
                             "data": {"message": 'Missing key\n  at ["parts"]', "kind": "Payload"}})  # fmt: skip
            return
        with fake.lock:
            step = fake.script.popleft() if fake.script else Step()
            fake.messages.setdefault(sid, []).append(body)
            if step.kind not in {"forget_session", "http_error"}:
                user = {"id": fake.new_id("msg"), "sessionID": sid, "role": "user"}
                fake.history.setdefault(sid, []).append({"info": user, "parts": body["parts"]})
        model = body.get("model") or {}
        info: dict[str, Any] = {
            "id": fake.new_id("msg"), "sessionID": sid, "role": "assistant", "mode": "build",
            "agent": "build", "cost": 0, "tokens": step.tokens,
            "modelID": model.get("modelID"), "providerID": model.get("providerID"),
            "time": {"created": int(time.time() * 1000)},
        }  # fmt: skip
        if step.kind == "forget_session":
            with fake.lock:
                fake.sessions.pop(sid, None)
            self._json(404, _not_found(sid))
            return
        if step.kind == "http_error":
            self._json(step.status, step.body or {"name": "UnknownError",
                       "data": {"message": "Unexpected server error.", "ref": "err_fake"}})  # fmt: skip
            return
        if step.kind == "info_error":
            self._record_reply(sid, {**info, "error": step.error}, [])
            self._json(200, {"info": {**info, "error": step.error}, "parts": []})
            return
        if step.kind == "hang":
            with fake.lock:
                fake.busy.add(sid)
            try:
                aborted = fake.aborted[sid].wait(step.hang_seconds)
            finally:
                with fake.lock:
                    fake.busy.discard(sid)
            error = {"name": "MessageAbortedError", "data": {"message": "Aborted"}}
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self._json(
                    200, {"info": {**info, "error": error} if aborted else info, "parts": []}
                )
            return
        prompt = "".join(p.get("text", "") for p in body["parts"] if p.get("type") == "text")
        text = step.text if step.text is not None else f"Echo: {prompt[-60:]}"
        part_base = {"sessionID": sid, "messageID": info["id"]}
        out: list[dict[str, Any]] = [{"type": "step-start", "id": "prt_1", **part_base}]
        if step.reasoning:
            out.append({"type": "reasoning", "id": "prt_2", "text": step.reasoning,
                        "time": {"start": 0}, **part_base})  # fmt: skip
        for i, tool in enumerate(step.tools):
            out.append({"type": "tool", "id": f"prt_t{i}", "callID": f"call_{i}", "tool": tool,
                        "state": {"status": "completed"}, **part_base})  # fmt: skip
        out.append({"type": "text", "id": "prt_3", "text": text, **part_base})
        out.append({"type": "step-finish", "id": "prt_4", "reason": "stop", "cost": 0,
                    "tokens": step.tokens, **part_base})  # fmt: skip
        self._record_reply(sid, {**info, "finish": "stop"}, out)
        self._json(200, {"info": {**info, "finish": "stop"}, "parts": out})

    def _record_reply(self, sid: str, info: dict[str, Any], parts: list[dict[str, Any]]) -> None:
        fake = self.server_fake
        with fake.lock:
            fake.history.setdefault(sid, []).append({"info": info, "parts": parts})
