"""CLI startup (issue 18): what `ccltune` costs before any synthesis starts.

Each row is a fresh `python -m ccltune ...` process, run `--repeat` times; the table gives the
median wall time and the median CPU time (user + sys of that process, os.wait4: on a loaded
machine wall time grows, CPU time much less), and how many modules it imports:
- `synthesize --help`: the command's import and typer's help rendering;
- `synthesize (imports + dispatch)`: a run that stops at its first check (`--collective x`), after
  the command has imported everything a real run uses (models, numpy, the engine);
- `unpack --help`: what every injected pod's init container pays to start;
- `--help`: every command imported, to list them.

    .venv/bin/python benchmarks/cli_startup.py
    PYTHONPATH=/tmp/old/operator .venv/bin/python benchmarks/cli_startup.py   # another tree
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from machine import cpu_model, load_average  # benchmarks/machine.py (run as scripts)

REPO = Path(__file__).resolve().parents[1]
ROWS = (
    ("synthesize --help", ["synthesize", "--help"]),
    ("synthesize (imports + dispatch)",
     ["synthesize", "--cluster", "syccl-a800-16", "--collective", "x"]),
    ("unpack --help", ["unpack", "--help"]),
    ("--help", ["--help"]),
)  # fmt: skip


def run(argv: list[str]) -> tuple[float, float]:
    """(wall s, CPU s) of one `python -m ccltune argv` process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "ccltune", *argv], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    _, _, usage = os.wait4(proc.pid, 0)
    return time.perf_counter() - t0, usage.ru_utime + usage.ru_stime


def modules(argv: list[str]) -> int:
    """Modules the process imports (`python -X importtime` lines, the header excluded)."""
    err = subprocess.run([sys.executable, "-X", "importtime", "-m", "ccltune", *argv], cwd=REPO,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True).stderr  # fmt: skip
    return sum(1 for line in err.splitlines() if line.startswith("import time:")) - 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7, help="processes per row (median reported)")
    args = ap.parse_args()
    import ccltune

    print(f"{platform.node()}: {os.cpu_count()} CPUs ({cpu_model()}), python "
          f"{platform.python_version()}, ccltune from {Path(ccltune.__file__).parent}, "
          f"load {load_average()} before")  # fmt: skip
    print(f"| command | wall s (median of {args.repeat}) | CPU s (median) | modules imported |")
    print("|---|---:|---:|---:|")
    for label, argv in ROWS:
        runs = [run(argv) for _ in range(args.repeat)]
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(f"| `ccltune {label}` | {wall:.3f} | {cpu:.3f} | {modules(argv)} |", flush=True)
    print(f"load {load_average()} after")


if __name__ == "__main__":
    main()
