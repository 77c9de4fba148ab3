"""libccltune-tuner.so lookup cost per getCollInfo call, for tables of 10, 1,000 and 100,000 rows.

Run: .venv/bin/python benchmarks/tuner_plugin.py

Builds the plugin (nccl-plugin/Makefile) and a small C driver (benchmarks/tuner_plugin_driver.c)
with the system compiler, writes each table with ccltune.tune.table.render_table (all rows on one
communicator shape and collective: the longest binary search), and asks for random sizes inside
the table's ranges, the way NCCL calls the plugin (v6, a fresh cost table per call). "net" is the
call time minus the same loop without the call (the cost-table copy); "init ms" is one
communicator's init (read, check and index the whole table); measured on this machine.
"""

from __future__ import annotations

import os
import platform
import random
import shutil
import subprocess
import tempfile
from pathlib import Path

from ccltune.tune.table import TABLE_ENV, TableRow, render_table
from machine import cpu_model

REPO = Path(__file__).resolve().parents[1]
ROWS = (10, 1_000, 100_000)
CALLS = 2_000_000
SAMPLES = 65_536
REPEATS = 5


def table(n: int) -> tuple[str, list[int]]:
    step = 4096
    rows = [TableRow("allreduce", i * step, i * step + step - 1, 16, 2, ("ring", "tree")[i % 2],
                     ("ll", "ll128", "simple")[i % 3], 1 + i % 32) for i in range(n)]
    rnd = random.Random(n)
    sizes = [rnd.randrange(0, n * step) for _ in range(SAMPLES)]
    return render_table(rows), sizes


def main() -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SystemExit("needs a C compiler (cc)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        subprocess.run(["make", "-s", "-C", str(REPO / "nccl-plugin"), f"OUT={out}", f"CC={cc}"], check=True)
        driver = out / "driver"
        subprocess.run([cc, "-std=c11", "-O2", "-Wall", "-Werror", f"-I{REPO / 'nccl-plugin'}", "-o", str(driver),
                        str(REPO / "benchmarks" / "tuner_plugin_driver.c"), "-ldl"], check=True)
        print(f"machine: {cpu_model()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}; "
              f"compiler: {subprocess.run([cc, '--version'], capture_output=True, text=True).stdout.splitlines()[0]}")
        print(f"{CALLS:,} getCollInfo calls per run, best of {REPEATS} runs (measured)\n")
        print(f"| {'table rows':>10} | {'ns/call':>8} | {'loop ns':>8} | {'net ns/call':>11} | {'matched':>8} | "
              f"{'init ms':>7} |")
        print(f"|{'-' * 12}|{'-' * 10}|{'-' * 10}|{'-' * 13}|{'-' * 10}|{'-' * 9}|")
        for n in ROWS:
            text, sizes = table(n)
            path = out / f"t{n}.table"
            path.write_text(text)
            env = {**os.environ, TABLE_ENV: str(path)}
            runs = []
            for _ in range(REPEATS):
                p = subprocess.run([str(driver), str(out / "libccltune-tuner.so"), "16", "2", str(CALLS)],
                                   input="\n".join(map(str, sizes)), capture_output=True, text=True, env=env,
                                   check=True)
                call, loop, matched, init = p.stdout.split()
                runs.append((float(call) - float(loop), float(call), float(loop), int(matched), float(init)))
            net, call, loop, matched, _ = min(runs)
            init_ms = min(r[4] for r in runs) / 1e3
            print(f"| {n:>10,} | {call:>8.1f} | {loop:>8.1f} | {net:>11.1f} | {matched / CALLS:>7.0%} | {init_ms:>7.2f} |")


if __name__ == "__main__":
    main()
