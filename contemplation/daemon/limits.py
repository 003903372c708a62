"""Process limits the daemon raises for itself at start."""

from __future__ import annotations

import resource

import structlog

log = structlog.get_logger("contemplation.limits")


def raise_fd_limit() -> int:
    """Raise the soft limit on open files to the hard limit (many watched folders and dashboard
    clients need more than the usual 1,024). Returns the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("fd_limit_unchanged", soft=soft, hard=hard, error=str(exc))
    return soft
