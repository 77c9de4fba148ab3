"""Mutated tables never crash the plugin: built with AddressSanitizer and UBSan, loaded by the
benchmark's C driver (NCCL's v6 calling convention), every load either disables the plugin with its
one log line or answers queries, without a sanitizer report."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from tuner_plugin_abi import PLUGIN_DIR, REPO

from ccltune.tune.table import (
    ALGORITHMS,
    PROTOCOLS,
    TABLE_ENV,
    TableError,
    TableRow,
    fnv1a64,
    parse_table,
    render_table,
)

SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g", "-O1"]


@pytest.fixture(scope="module")
def sanitized(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "needs a C compiler (cc)"
    out = tmp_path_factory.mktemp("asan")
    so, drv = out / "libccltune-tuner.so", out / "driver"
    p = subprocess.run([cc, "-std=c11", *SANITIZE, "-fPIC", "-shared", "-o", str(so), str(PLUGIN_DIR / "plugin.c"),
                        str(PLUGIN_DIR / "table.c"), str(PLUGIN_DIR / "trial.c")], capture_output=True, text=True)
    if p.returncode and "asan" in p.stderr.lower():
        pytest.skip(f"the compiler has no sanitizer runtime: {p.stderr.strip()[:200]}")
    assert p.returncode == 0, p.stderr
    subprocess.run([cc, "-std=c11", *SANITIZE, f"-I{PLUGIN_DIR}", "-o", str(drv),
                    str(REPO / "benchmarks" / "tuner_plugin_driver.c"), "-ldl"], check=True)
    return so, drv


def _mutants(n: int) -> list[str]:
    rows = [TableRow("allreduce", i * 100, i * 100 + 99, 16, 2, ("ring", "tree", "nvls")[i % 3], "simple", 1 + i)
            for i in range(40)]
    good = render_table([*rows, TableRow("allreduce", 0, 99, 16, 2, "tree", "ll", 8, 4096)])
    rnd = random.Random(13)
    out = ["", "\n", "ccltune-tuner-table 1\n", "ccltune-tuner-table 1\ndigest fnv1a64 cbf29ce484222325 rows 0\n",
           "x" * 100_000, good]
    for _ in range(n):
        text = list(good)
        for _ in range(rnd.randint(1, 3)):
            i = rnd.randrange(len(text))
            op = rnd.random()
            if op < 0.4:
                text[i] = chr(rnd.randrange(1, 256))
            elif op < 0.7:
                del text[i]
            else:
                text.insert(i, rnd.choice(["\n", " ", "9" * 30, "-", "#", "\t", "\0", "\r"]))
        out.append("".join(text))
        out.append(_redigest(out[-1]))  # the same mutation past the digest check, into the field checks
    return out


def _redigest(text: str) -> str:
    lines = text.split("\n")
    if len(lines) < 3 or not lines[1].startswith("digest fnv1a64 "):
        return text
    body = [ln for ln in lines[2:] if ln and not ln.startswith("#")]
    h = 0xCBF29CE484222325
    for ln in body:
        h = fnv1a64(ln.encode("latin-1") + b"\n", h)
    rows = sum(1 for ln in body if ln.split(None, 1)[:1] != ["nvls-channels"])
    lines[1] = f"digest fnv1a64 {h:016x} rows {rows}"
    return "\n".join(lines)


SIZES = [0, 50, 99, 150, 3999, 4000, (1 << 64) - 1]
CALLS = 210  # each size 30 times
ALL = {(a, p): 1.0 for a in ALGORITHMS for p in PROTOCOLS}  # the driver offers every cell


def test_mutated_tables_never_crash(sanitized, tmp_path) -> None:
    so, drv = sanitized
    loaded = 0
    for i, text in enumerate(_mutants(120)):
        path = tmp_path / f"t{i}.table"
        path.write_bytes(text.encode("latin-1"))
        env = {**os.environ, TABLE_ENV: str(path)}
        p = subprocess.run([str(drv), str(so), "16", "2", str(CALLS)], input=" ".join(map(str, SIZES)),
                           capture_output=True, text=True, env=env, timeout=60)
        assert p.returncode == 0 and "runtime error" not in p.stderr and "Sanitizer" not in p.stderr, (i, p.stderr)
        try:
            table = parse_table(path.read_bytes().decode("latin-1"))
            want = sum(table.lookup("allreduce", s, 16, 2, ALL) is not None for s in SIZES) * (CALLS // len(SIZES))
            loaded += 1
        except TableError:
            want = 0  # refused: the plugin disables itself and matches nothing
        assert int(p.stdout.split()[2]) == want, (i, text[:300])  # the plugin loads what the reference accepts
    assert loaded >= 2  # the good table, the empty one, harmless mutations (a comment, a blank line)
