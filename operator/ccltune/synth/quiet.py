"""HiGHS without its banner: the C++ constructor prints it to fd 1, past any output_flag.

`ccltune -v` (CCLTUNE_SOLVER_OUTPUT=1, inherited by worker processes) keeps it and the log.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import highspy

SOLVER_OUTPUT_ENV = "CCLTUNE_SOLVER_OUTPUT"


def solver_output_wanted() -> bool:
    return os.environ.get(SOLVER_OUTPUT_ENV, "") not in ("", "0")


def _flush_c_stdio() -> None:
    # The banner may sit in C's stdout buffer (stdout is a pipe): flush it while fd 1 is /dev/null.
    with suppress(OSError, AttributeError):
        ctypes.CDLL(None).fflush(None)


@contextmanager
def _fd1_to_devnull() -> Iterator[None]:
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        _flush_c_stdio()
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


# HiGHS prints the banner once per process, at the first construction: only that one needs fd 1
# redirected, so the window in which other threads' stdout is lost stays one constructor long.
_first = threading.Lock()
_banner_done = False


def new_highs() -> highspy.Highs:
    """A Highs instance that prints nothing, unless solver output was asked for."""
    global _banner_done
    if solver_output_wanted() or _banner_done:
        return highspy.Highs()
    with _first:
        if _banner_done:
            return highspy.Highs()
        with _fd1_to_devnull():
            h = highspy.Highs()
        _banner_done = True
    return h
