"""A plugin whose code fails in every way plugin code can, installed by
tests/system/test_plugin_faults.py as the distribution ``contemplation-faulty`` (a dist-info folder
naming these kinds, as pip writes one), so that a real daemon finds it by its entry points.

* the backend ``faulty`` streams one piece, then fails as the conversation's model says:
  ``keyboard`` (KeyboardInterrupt), ``exit`` (SystemExit), ``cancelled`` (a CancelledError
  of its own), ``base`` (a bare BaseException), ``os_exit`` (``os._exit(0)``: the process
  ends; each such stream first appends a line to the file ``FAULTY_BEGUN`` names, when set);
  any other model is answered ``fine``;
* the NEED tool ``faulty`` (rule ``faulty_answer``: ``NEED: Faulty answer for X``) raises
  SystemExit from its call;
* the context kind ``faulty`` raises KeyboardInterrupt when asked for its jobs.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator, Mapping
from typing import Any

from contemplation.plugin import (
    BackendInputs,
    BackendKind,
    BackendSession,
    Capabilities,
    ChatRequest,
    Check,
    ContextKind,
    Job,
    Rule,
    StreamEvent,
    ToolInputs,
    ToolKind,
    ToolResult,
    Usage,
)

RAISED: dict[str, type[BaseException]] = {
    "keyboard": KeyboardInterrupt,
    "exit": SystemExit,
    "cancelled": asyncio.CancelledError,
    "base": BaseException,
}


class FaultyBackend:
    name = "faulty"
    label = "FAULTY"
    concurrency = 8

    async def stream(self, request: ChatRequest) -> AsyncGenerator[StreamEvent, None]:
        if request.model == "os_exit" and os.environ.get("FAULTY_BEGUN"):
            with open(os.environ["FAULTY_BEGUN"], "a") as begun:  # noqa: ASYNC230 - a test's note
                begun.write("begun\n")
        yield StreamEvent("content", "a first piece ")
        if request.model == "os_exit":
            os._exit(0)
        raised = RAISED.get(request.model)
        if raised is not None:
            raise raised(f"the faulty plugin raised {raised.__name__}")
        yield StreamEvent("content", "fine")
        yield StreamEvent("done", usage=Usage(prompt_eval_count=1, eval_count=2))

    async def capabilities(self, model: str) -> Capabilities:
        return Capabilities(context_length=32_768, source="config")

    async def check(self, model: str | None) -> list[Check]:
        return [Check("faulty", True, "answers at once")]

    async def models(self) -> list[str]:
        return [*RAISED, "os_exit", "fine"]

    async def forget(self, conversation_id: str, session: BackendSession | None = None) -> None:
        return None

    async def aclose(self) -> None:
        return None


def _backend(made: BackendInputs) -> FaultyBackend:
    return FaultyBackend()


faulty = BackendKind("faulty", _backend)


class FaultyTool:
    name = "faulty"

    async def call(self, arguments: Mapping[str, Any]) -> ToolResult:
        raise SystemExit("the faulty tool called sys.exit")


def _tool(made: ToolInputs) -> FaultyTool:
    return FaultyTool()


faulty_tool = ToolKind(
    "faulty",
    "fails with SystemExit",
    default_arg="what",
    make=_tool,
    rules=(
        Rule(
            "faulty_answer",
            "faulty",
            {"what": "{what}"},
            prefix="Faulty answer for",
            param="what",
            description="An answer the faulty plugin never gives.",
        ),
    ),
)


def _jobs(requirement: Mapping[str, Any]) -> list[Job] | str:
    raise KeyboardInterrupt("the faulty context kind was interrupted")


faulty_context = ContextKind("faulty", "background", _jobs, "fails with KeyboardInterrupt")


# A plugin that starts a thread that never ends (not a daemon thread) when it is imported, as
# a module ``lingers`` of the distribution ``contemplation-lingers``: a backend ``lingers``
# (the faulty backend's behaviour) whose module's thread would hold every exit of the process.
LINGERS = """\
import threading

from contemplation.plugin import BackendKind
from tests.faulty_plugin import FaultyBackend


def _forever():
    threading.Event().wait()


threading.Thread(target=_forever, name="lingering-worker").start()
kind = BackendKind("lingers", lambda made: FaultyBackend())
"""
