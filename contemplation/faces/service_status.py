"""``service status --json``: the service manager's view of the daemon as one object.

systemd answers ``systemctl --user show`` in ``key=value`` lines (LoadState, ActiveState,
SubState, MainPID); launchd's ``launchctl print`` exits non-zero for a job it has not loaded
and lists ``state = running`` and ``pid = N`` for one it has. Beside them, the home's own word
(``daemon_running``): whether a daemon answers for this home, however it was started.
"""

from __future__ import annotations

import os
import re
from typing import Any

from contemplation.errors import ContemplationError
from contemplation.faces import service
from contemplation.store.layout import Home
from contemplation.writer.files import daemon_alive

_PROPERTIES = "LoadState,ActiveState,SubState,MainPID"
_LAUNCHD_RE = re.compile(r"^\s*(state|pid)\s*=\s*(\S+)\s*$", re.M)


def _systemd(run: service.Runner) -> dict[str, Any]:
    proc = run(["systemctl", "--user", "show", service.UNIT, f"--property={_PROPERTIES}"], True)
    props = dict(
        line.split("=", 1) for line in (proc.stdout or "").splitlines()[:16] if "=" in line
    )
    pid = props.get("MainPID", "")
    return {
        "loaded": props.get("LoadState") == "loaded",
        "active": props.get("ActiveState") == "active",
        "state": props.get("SubState") or None,
        "pid": int(pid) if pid.isdigit() and int(pid) > 0 else None,
    }


def _launchd(run: service.Runner) -> dict[str, Any]:
    proc = run(["launchctl", "print", f"gui/{os.getuid()}/{service.LABEL}"], True)
    if proc.returncode != 0:
        return {"loaded": False, "active": False, "state": None, "pid": None}
    found = dict(_LAUNCHD_RE.findall((proc.stdout or "")[: 64 << 10]))
    pid = found.get("pid", "")
    return {
        "loaded": True,
        "active": found.get("state") == "running",
        "state": found.get("state"),
        "pid": int(pid) if pid.isdigit() else None,
    }


def status(
    manager: service.Manager, home: Home, run: service.Runner = service.run_command
) -> dict[str, Any]:
    """What the manager says of the unit, and whether a daemon answers for ``home``."""
    path = service.unit_path(manager)
    out: dict[str, Any] = {"manager": manager, "unit_file": str(path), "installed": path.exists()}
    try:
        out |= _systemd(run) if manager == "systemd" else _launchd(run)
    except ContemplationError as exc:  # the manager's command is not there
        out |= {"loaded": False, "active": False, "state": None, "pid": None, "error": str(exc)}
    out["daemon_running"] = daemon_alive(home)
    return out
