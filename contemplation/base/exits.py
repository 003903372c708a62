"""The CLI's exit codes and its one way to fail: a line on stderr. Light on purpose (click
only): the entry point imports it before it knows which command runs."""

from __future__ import annotations

import errno
import sys
from typing import NoReturn

import click

EXIT_OK = 0
EXIT_ERROR = 1  # also a bad configuration, an unknown conversation, a failed turn
# 2: a bad option or argument (click's own exit)
EXIT_NEEDS_AGENT = 3  # send --wait: the model waits for a NEED no rule answers
EXIT_TIMEOUT = 4  # send --wait --timeout: no reply in time (it stays queued)
EXIT_CUT = 5  # --wait: the reply was stopped before its end (a loop, the token limit)
EXIT_PLUGIN = 70  # a plugin ended the process (os._exit): a failure, restarted by systemd
EXIT_INTERRUPTED = 130  # Ctrl-C

EXIT_CODES = """\b
Exit codes:
  0    done
  1    error (one line on stderr)
  2    bad usage
  3    the model waits for the agent (--wait: a need to answer or a lookup to approve)
  4    timed out (send --wait --timeout); the reply still comes
  5    the reply was stopped before its end (--wait: a loop, or the token limit);
       `contemplation continue` has the model go on
  70   a plugin ended the process (os._exit): run's service is restarted
  130  interrupted (Ctrl-C)
"""


def fail(message: str, code: int = EXIT_ERROR) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})  # no room, or the quota is spent
CHAIN_MAX = 8  # causes and contexts looked through for a full disk


def disk_full(exc: BaseException) -> BaseException | None:
    """The error in ``exc`` or the chain of errors behind it that says the disk is full (an
    ``OSError`` of ENOSPC or EDQUOT, SQLite's SQLITE_FULL), or None. SQLite's is recognised
    by its name, so this module need not import sqlite3."""
    cur: BaseException | None = exc
    for _ in range(CHAIN_MAX):
        if cur is None:
            return None
        if isinstance(cur, OSError) and cur.errno in FULL_ERRNOS:
            return cur
        if getattr(cur, "sqlite_errorname", None) == "SQLITE_FULL":
            return cur
        cur = cur.__cause__ or cur.__context__
    return None
