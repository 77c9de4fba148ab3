"""Run `ccltune` in a pseudo-terminal of a given width, as a user's shell would, and read what
the terminal would show: the real rich/typer terminal path, not a pipe's fallback width."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import sys
import termios
from dataclasses import dataclass
from pathlib import Path

from rich.cells import cell_len

ROOT = Path(__file__).resolve().parents[2]
# CSI (colours, cursor moves), OSC (titles, links) and two-byte escapes.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
# Banners of the solvers ccltune drives (HiGHS via highspy; scipy's milp wraps HiGHS too).
SOLVER_BANNERS = ("Running HiGHS", "Copyright (c)", "THIRD_PARTY_NOTICES", "Coefficient ranges")


@dataclass(frozen=True)
class Screen:
    status: int
    raw: str

    @property
    def lines(self) -> list[str]:
        """Every line the terminal showed, transient progress lines included (split at \\r)."""
        text = _ESCAPES.sub("", self.raw)
        return [part for line in text.split("\n") for part in line.split("\r")]

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def too_wide(self, width: int) -> list[str]:
        return [line for line in self.lines if cell_len(line.rstrip()) > width]


def run_in_terminal(*args: str | Path, columns: int = 80, rows: int = 50,
                    env: dict[str, str] | None = None, max_bytes: int = 8 << 20) -> Screen:  # fmt: skip
    """`python -m ccltune ARGS` on a pty of `columns` x `rows`; stdout and stderr both go to it."""
    pid, fd = pty.fork()
    if pid == 0:  # child: the pty is its controlling terminal, stdin/stdout/stderr
        child_env = {k: v for k, v in os.environ.items()
                     if k not in ("COLUMNS", "LINES", "CCLTUNE_DEBUG", "CCLTUNE_SOLVER_OUTPUT")}  # fmt: skip
        child_env.update({"TERM": "xterm-256color", **(env or {})})
        # The size is set before exec, so the first thing the program asks gets the answer.
        fcntl.ioctl(1, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        os.chdir(ROOT)
        os.execve(sys.executable, [sys.executable, "-m", "ccltune", *map(str, args)], child_env)
    chunks: list[bytes] = []
    size = 0
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
        size += len(data)
        if size > max_bytes:
            os.kill(pid, 9)
            break
    os.close(fd)
    _, status = os.waitpid(pid, 0)
    return Screen(os.waitstatus_to_exitcode(status), b"".join(chunks).decode(errors="replace"))
