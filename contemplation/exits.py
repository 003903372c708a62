"""The CLI's exit codes and its one way to fail: a line on stderr. Light on purpose (click
only): the entry point imports it before it knows which command runs."""

from __future__ import annotations

import sys
from typing import NoReturn

import click

EXIT_OK = 0
EXIT_ERROR = 1  # also a bad configuration, an unknown conversation, a failed turn
# 2: a bad option or argument (click's own exit)
EXIT_NEEDS_AGENT = 3  # send --wait: the model waits for a NEED no rule answers
EXIT_TIMEOUT = 4  # send --wait --timeout: no reply in time (it stays queued)
EXIT_INTERRUPTED = 130  # Ctrl-C

EXIT_CODES = """\b
Exit codes:
  0    done
  1    error (one line on stderr)
  2    bad usage
  3    the model waits for the agent (--wait: a need to answer or a lookup to approve)
  4    timed out (send --wait --timeout); the reply still comes
  130  interrupted (Ctrl-C)
"""

def fail(message: str, code: int = EXIT_ERROR) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)
