"""What the daemon tells its observers, made useful to the dashboard: a fan-out of events to
the open SSE streams, and counters for the metrics panel.

Both are fed by :meth:`observe` (a :data:`contemplation.engine.pipeline.Observer`), which runs in
the
daemon's event loop and never blocks: a slow browser loses events (it is told to resync), the
pipeline never waits.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from contemplation.models import ConvEvent

QUEUE_SIZE = 2000
STREAM_ONLY = {
    ConvEvent.TOKEN,
    ConvEvent.THINKING,
}  # only sent to a stream that follows that conversation
RESPONSE_TIMES_KEPT = 1000


@dataclass(eq=False)
class Subscription:
    conv: str | None  # None: every conversation, without streamed tokens
    queue: asyncio.Queue[tuple[str, str, dict[str, Any]]] = field(
        default_factory=lambda: asyncio.Queue(QUEUE_SIZE)
    )
    overflowed: bool = False


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


@dataclass
class Metrics:
    started: float = field(default_factory=time.time)
    events: Counter[str] = field(default_factory=Counter)
    tools: Counter[str] = field(default_factory=Counter)
    response_ms: deque[float] = field(default_factory=lambda: deque(maxlen=RESPONSE_TIMES_KEPT))
    first_token_ms: deque[float] = field(default_factory=lambda: deque(maxlen=RESPONSE_TIMES_KEPT))
    tokens_in: int = 0
    tokens_out: int = 0
    _turn_started: dict[str, float] = field(default_factory=dict)

    def record(self, conv_id: str, event: str, data: dict[str, Any]) -> None:
        if event in STREAM_ONLY:
            return
        self.events[event] += 1
        route = data.get("route") or data.get("tool")
        if isinstance(route, str) and route:
            self.tools[route] += 1
        if event == ConvEvent.GENERATING:
            self._turn_started[conv_id] = time.monotonic()
        elif event in {ConvEvent.REPLY, ConvEvent.ERROR, ConvEvent.CANCELLED, ConvEvent.RETRYING}:
            began = self._turn_started.pop(conv_id, None)
            usage = data.get("usage") or {}
            if event == ConvEvent.REPLY:
                wall = usage.get("wall_ms")
                if wall is None and began is not None:
                    wall = (time.monotonic() - began) * 1000
                if wall is not None:
                    self.response_ms.append(float(wall))
                if usage.get("first_token_ms") is not None:
                    self.first_token_ms.append(float(usage["first_token_ms"]))
                self.tokens_in += int(usage.get("prompt_eval_count") or 0)
                self.tokens_out += int(usage.get("eval_count") or 0)

    def snapshot(self) -> dict[str, Any]:
        times = list(self.response_ms)
        firsts = list(self.first_token_ms)
        return {
            "since": self.started,
            "uptime_s": round(time.time() - self.started, 1),
            "turns": self.events[ConvEvent.REPLY],
            "messages": self.events[ConvEvent.MESSAGE],
            "errors": self.events["error"],
            "retries": self.events["retrying"],
            "cancelled": self.events["cancelled"],
            "rejected": self.events["rejected"],
            "tokens": {"prompt": self.tokens_in, "completion": self.tokens_out},
            "response_ms": {f"p{q}": percentile(times, q) for q in (50, 90, 99)}
            | {"count": len(times)},
            "first_token_ms": {f"p{q}": percentile(firsts, q) for q in (50, 90, 99)},
            "tool_requests": dict(self.tools.most_common()),
        }


class Broker:
    def __init__(self) -> None:
        self.subs: set[Subscription] = set()
        self.metrics = Metrics()

    def observe(self, conv_id: str, event: str, data: dict[str, Any]) -> None:
        self.metrics.record(conv_id, event, data)
        for sub in list(self.subs):
            if event in STREAM_ONLY and sub.conv != conv_id:
                continue
            if sub.conv is not None and sub.conv != conv_id:
                continue
            try:
                sub.queue.put_nowait((conv_id, event, _jsonable(data)))
            except asyncio.QueueFull:
                sub.overflowed = True

    def subscribe(self, conv: str | None) -> Subscription:
        sub = Subscription(conv)
        self.subs.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self.subs.discard(sub)


def _jsonable(data: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in data.items():
        out[k] = v if isinstance(v, str | int | float | bool | dict | list | type(None)) else str(v)
    return out
