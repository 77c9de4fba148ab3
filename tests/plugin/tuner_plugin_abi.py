"""Build libccltune-tuner.so with the system compiler and call it through NCCL's struct layouts
(nccl-plugin/nccl_tuner_abi.h, restated from NCCL 2.30.7's tuner_v3/v5/v6.h), as NCCL does:
dlopen, dlsym the versioned symbol, init, getCollInfo with a [numAlgo][numProto] float table
where unusable cells are -1, finalize."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ccltune.tune.table import ALGORITHMS, COLLECTIVES, PROTOCOLS

REPO = Path(__file__).resolve().parents[2]
PLUGIN_DIR = REPO / "nccl-plugin"
HERE = Path(__file__).resolve().parent
N_ALGO, N_PROTO = len(ALGORITHMS), len(PROTOCOLS)
IGNORE = -1.0

c_size_t = ctypes.c_size_t
Logger = ctypes.c_void_p  # the shim's variadic function, passed by address
InitV5 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint64, c_size_t, c_size_t,
                          Logger, ctypes.c_void_p, ctypes.c_void_p)
CollInfoV5 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, c_size_t, ctypes.c_int,
                              ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int))
Finalize = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
ChunkV6 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, c_size_t, ctypes.c_int, ctypes.c_int,
                           ctypes.c_int, ctypes.POINTER(c_size_t))
InitV3 = ctypes.CFUNCTYPE(ctypes.c_int, c_size_t, c_size_t, Logger, ctypes.POINTER(ctypes.c_void_p))
CollInfoV3 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, c_size_t, ctypes.c_int,
                              ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int))


class TunerV6(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("init", InitV5), ("getCollInfo", CollInfoV5),
                ("finalize", Finalize), ("getChunkSize", ChunkV6)]


class TunerV5(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("init", InitV5), ("getCollInfo", CollInfoV5), ("finalize", Finalize)]


class TunerV3(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("init", InitV3), ("getCollInfo", CollInfoV3), ("destroy", Finalize)]


class NvlDomain(ctypes.Structure):
    _fields_ = [("nNvlDomains", ctypes.c_int), ("minRanks", ctypes.c_int), ("maxRanks", ctypes.c_int)]


class Constants(ctypes.Structure):  # ncclTunerConstants_v5_t: 7x3 + 3x7x3 + 5 x 4x3 doubles
    _fields_ = [("values", ctypes.c_double * (21 + 63 + 60))]


def build(out: Path) -> tuple[Path, Path]:
    """(plugin .so, log shim .so), built with `cc` through the plugin's Makefile."""
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "the plugin tests need a C compiler (cc)"
    out.mkdir(parents=True, exist_ok=True)
    if shutil.which("make"):
        subprocess.run(["make", "-s", "-C", str(PLUGIN_DIR), f"OUT={out}", f"CC={cc}"], check=True)
    else:  # the Makefile's own command line
        subprocess.run([cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-Wpedantic", "-fPIC", "-fvisibility=hidden",
                        "-O2", "-shared", "-o", str(out / "libccltune-tuner.so"),
                        str(PLUGIN_DIR / "plugin.c"), str(PLUGIN_DIR / "table.c"), str(PLUGIN_DIR / "trial.c")], check=True)
    shim = out / "liblogshim.so"
    subprocess.run([cc, "-std=c11", "-Wall", "-Werror", "-fPIC", "-shared", "-o", str(shim), str(HERE / "logshim.c")],
                   check=True)
    return out / "libccltune-tuner.so", shim


@dataclass
class Result:
    algorithm: str | None
    protocol: str | None
    channels: int
    table: list[float]  # the cost table after the call


class Log:
    def __init__(self, shim: Path) -> None:
        self.lib = ctypes.CDLL(str(shim))
        self.lib.shimLine.restype = ctypes.c_char_p
        self.address = ctypes.cast(self.lib.shimLog, ctypes.c_void_p).value

    def reset(self) -> None:
        self.lib.shimReset()

    def lines(self) -> list[tuple[int, str]]:
        return [(self.lib.shimLevel(i), self.lib.shimLine(i).decode()) for i in range(self.lib.shimCount())]


def cost_table(offered: Mapping[tuple[str, str], float]) -> list[float]:
    return [offered.get((a, p), IGNORE) for a in ALGORITHMS for p in PROTOCOLS]


class Plugin:
    """One communicator of the plugin through ABI `version` (6, 5 or 3)."""

    def __init__(self, so: Path, log: Log, version: int, nranks: int, nnodes: int) -> None:
        lib = ctypes.CDLL(str(so))
        kind = {6: TunerV6, 5: TunerV5, 3: TunerV3}[version]
        self.api = kind.in_dll(lib, f"ncclTunerPlugin_v{version}")
        self.version = version
        self.ctx = ctypes.c_void_p()
        if version == 3:
            rc = self.api.init(nranks, nnodes, log.address, ctypes.byref(self.ctx))
        else:
            nvl = NvlDomain(nnodes, nranks // nnodes, nranks // nnodes)
            self.constants = Constants()
            rc = self.api.init(ctypes.byref(self.ctx), 1, nranks, nnodes, log.address, ctypes.byref(nvl),
                               ctypes.byref(self.constants))
        assert rc == 0, f"init returned {rc}"

    def query(self, coll: str, nbytes: int, offered: Mapping[tuple[str, str], float]) -> Result:
        table = (ctypes.c_float * (N_ALGO * N_PROTO))(*cost_table(offered))
        nch = ctypes.c_int(0)
        f = COLLECTIVES.index(coll)
        if self.version == 3:
            rc = self.api.getCollInfo(self.ctx, f, nbytes, 1, ctypes.cast(table, ctypes.c_void_p), N_ALGO, N_PROTO,
                                      ctypes.byref(nch))
        else:
            rc = self.api.getCollInfo(self.ctx, f, nbytes, 1, ctypes.cast(table, ctypes.c_void_p), N_ALGO, N_PROTO,
                                      0, ctypes.byref(nch))
        assert rc == 0
        after = list(table)
        zero = [i for i, v in enumerate(after) if v == 0.0]
        assert len(zero) <= 1
        if not zero:
            return Result(None, None, nch.value, after)
        a, p = divmod(zero[0], N_PROTO)
        return Result(ALGORITHMS[a], PROTOCOLS[p], nch.value, after)

    def chunk(self, coll: str, nbytes: int, algorithm: str, protocol: str, nccl_chunk: int) -> int:
        size = c_size_t(nccl_chunk)
        rc = self.api.getChunkSize(self.ctx, COLLECTIVES.index(coll), nbytes, ALGORITHMS.index(algorithm),
                                   PROTOCOLS.index(protocol), 8, ctypes.byref(size))
        assert rc == 0
        return size.value

    def close(self) -> None:
        fin = self.api.destroy if self.version == 3 else self.api.finalize
        assert fin(self.ctx) == 0
