"""Run only by ``test_hermetic``, in a pytest of its own that it then sends SIGTERM (the name is
no ``test_*.py``: the suite does not collect it). A daemon started through the conftest's
fixture and a bare server only registered with :mod:`tests.procgroups`; their pids go to
``$HERMETIC_PROBE_PIDS``, then the test waits for the signal."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from contemplation.store.layout import Home
from tests import procgroups
from tests.conftest import DaemonProc, base_env
from tests.fakes.ollama_server import FakeOllama


def test_wait_for_sigterm(
    home: Home, fake_ollama: FakeOllama, daemon_factory: Callable[..., DaemonProc]
) -> None:
    daemon = daemon_factory(base_env(home, fake_ollama), home, "--no-dashboard").wait_ready()
    bare = procgroups.popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], stdin=subprocess.DEVNULL
    )
    out = Path(os.environ["HERMETIC_PROBE_PIDS"])
    tmp = out.with_suffix(".tmp")
    tmp.write_text(f"{daemon.proc.pid} {bare.pid}\n")
    tmp.rename(out)
    threading.Event().wait(60)  # the SIGTERM comes long before
    raise AssertionError("no SIGTERM came")
