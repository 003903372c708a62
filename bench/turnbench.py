"""What the benchmarks that run real model turns through the pipeline share: a throwaway home
whose conversations all use one backend and model, and a percentile."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from contemplation.engine.pipeline import Runtime  # noqa: E402
from contemplation.models import Metadata  # noqa: E402
from contemplation.settings import load  # noqa: E402
from contemplation.store.layout import Conv, Home  # noqa: E402
from contemplation.store.templates import load_template  # noqa: E402
from contemplation.writer import drop_message, new_conversation, write_metadata  # noqa: E402


def percentile(xs: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks (q in 0..1)."""
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


class TurnHome:
    """A temp home and runtime whose new conversations use ``backend``/``model`` with
    ``options``; ``section`` is that backend's settings (``{"base_url": ...}``)."""

    def __init__(
        self, backend: str, model: str, options: dict[str, Any], section: dict[str, Any]
    ) -> None:
        self.backend, self.model, self.options = backend, model, options
        self.tmp = Path(tempfile.mkdtemp(prefix=f"bench-{backend}-"))
        self.home = Home(self.tmp / "home")
        settings = load(
            home=self.home.root,
            env={},
            config=None,
            overrides={
                "settle_seconds": 0,
                "log_level": "warning",
                "default_backend": backend,
                "default_model": model,
                backend: section,
            },
        )
        self.rt = Runtime(settings=settings, home=self.home)
        self.template = load_template(self.home, "default")

    def conversation(self, topic: str, message: str) -> tuple[Conv, Metadata]:
        """A new conversation with ``message`` waiting in its inbox."""
        conv = new_conversation(
            self.home, topic, template=self.template, model=self.model, backend=self.backend
        )
        meta = self.rt.default_metadata(conv).model_copy(
            update={
                "id": conv.id,
                "backend": self.backend,
                "model": self.model,
                "options": self.options,
            }
        )
        write_metadata(conv, meta)
        drop_message(conv, message)
        return conv, meta

    async def aclose(self) -> None:
        await self.rt.aclose()
        shutil.rmtree(self.tmp, ignore_errors=True)
