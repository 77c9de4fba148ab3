"""nccl-tests: the command line of one trial, and the parser of its stdout.

Output format (nccl-tests README / src/common.cu): one row per size with
`size count type redop [root] time algbw busbw #wrong` for out-of-place then in-place; `root` is
printed by newer releases only. Comment lines start with '#'; NCCL's own log lines
(`host:pid:tid [dev] NCCL INFO ...`) may be interleaved when NCCL_DEBUG is set. A line such as
`NCCL:` or `MSCCL:` names the section that follows (our convention for side-by-side logs).
Real multi-node logs also carry banner lines without '#' (`NCCL version 2.26.2+cuda12.8`; rccl-tests:
`rccl-tests: Version ...`, `RCCL version : ...`, `Hostname : ...`), launcher warnings (`Warning: ...`)
and, under `mpirun --tag-output`, a `[job,rank]<stdout>:` prefix on every line: all are skipped.
Options used (nccl-tests README): -b/-e min/max bytes, -f step factor, -g GPUs per process,
-n iterations, -w warm-up iterations, -c 0 (no correctness check), -d data type, -o reduction op.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ...api.common import Collective
from ...api.errors import InputError
from ..space import LL128_THREADS, NCCL_ALGO_NAME, Config

BINARIES = {
    Collective.ALLREDUCE: "all_reduce_perf",
    Collective.ALLGATHER: "all_gather_perf",
    Collective.REDUCESCATTER: "reduce_scatter_perf",
    Collective.ALLTOALL: "alltoall_perf",
    Collective.BROADCAST: "broadcast_perf",
}
_REDUCING = {Collective.ALLREDUCE, Collective.REDUCESCATTER}
_SECTION = re.compile(r"^\s*([A-Za-z][\w .+-]{0,62}):\s*$")
_NCCL_LOG = re.compile(r"\bNCCL (INFO|WARN|TRACE|ABORT)\b")
_BANNER = re.compile(
    r"^(?:(?:NCCL|RCCL|HIP|ROCm) version\b|rccl-tests:|nccl-tests version|Hostname\s*:|Librccl path\s*:"
    r"|Warning:)",
    re.IGNORECASE,
)
_MPI_TAG = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:")


@dataclass(frozen=True, slots=True)
class Row:
    size: int
    count: int
    dtype: str
    redop: str
    root: int | None
    time_us: float  # out-of-place
    algbw_gbps: float
    busbw_gbps: float
    inplace_time_us: float
    inplace_algbw_gbps: float
    inplace_busbw_gbps: float
    line: int


@dataclass
class NcclTestsLog:
    name: str
    sections: dict[str, list[Row]] = field(default_factory=dict)

    def rows(self, section: str | None = None) -> list[Row]:
        if section is None:
            if len(self.sections) != 1:
                raise InputError(f"{self.name}: has sections {sorted(self.sections)}; name one")
            return next(iter(self.sections.values()))
        return self.sections[section]


def _num(text: str, what: str, where: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise InputError(f"{where}: {what} {text!r} is not a number") from None


def parse_log(text: str, name: str = "<stdout>") -> NcclTestsLog:
    """Parse nccl-tests stdout. A malformed result line is an error naming the line."""
    log = NcclTestsLog(name)
    section = ""
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = _MPI_TAG.sub("", raw.strip(), count=1).strip()
        if not line or line.startswith("#") or _NCCL_LOG.search(line) or _BANNER.match(line):
            continue
        m = _SECTION.match(line)
        if m:
            section = m.group(1).strip()
            continue
        where = f"{name}:{lineno}"
        tok = line.split()
        if len(tok) not in (12, 13):
            raise InputError(
                f"{where}: malformed nccl-tests row (expected 12 or 13 columns: size count type "
                f"redop [root] time algbw busbw #wrong time algbw busbw #wrong, got {len(tok)}): {line!r}"
            )
        has_root = len(tok) == 13
        if not tok[0].isdigit() or not tok[1].isdigit():
            raise InputError(f"{where}: size and count must be integers: {line!r}")
        o = 5 if has_root else 4
        vals = [_num(tok[o + i], col, where) for i, col in
                ((0, "time"), (1, "algbw"), (2, "busbw"), (4, "time"), (5, "algbw"), (6, "busbw"))]
        if vals[0] <= 0 or vals[3] <= 0:
            raise InputError(f"{where}: time must be positive: {line!r}")
        for i in (3, 7):  # the #wrong columns: a count, an error magnitude, or N/A without -c
            if tok[o + i] != "N/A":
                _num(tok[o + i], "#wrong", where)
        if has_root and not tok[4].lstrip("-").isdigit():
            raise InputError(f"{where}: root {tok[4]!r} is not an integer: {line!r}")
        root = int(tok[4]) if has_root else None
        row = Row(int(tok[0]), int(tok[1]), tok[2], tok[3], root, vals[0], vals[1], vals[2], vals[3],
                  vals[4], vals[5], lineno)
        log.sections.setdefault(section, []).append(row)
    if not log.sections:
        raise InputError(f"{name}: no nccl-tests result rows found")
    return log


_RANK_LINE = re.compile(r"^#\s*Rank\s+(\d+)\s+(?:Group\s+(-?\d+)\s+)?.*?\bon\s+(\S+)\s+device\b")


def log_shape(text: str) -> tuple[int, int] | None:
    """(ranks, nodes) from nccl-tests' '#  Rank  N Group  G Pid  P on HOST device D' lines: of
    rank 0's group, since a split run (NCCL_TESTS_SPLIT) lists every rank with its group (color)
    and measures one communicator per group (src/util.cu writeDeviceReport)."""
    ranks: dict[int, tuple[str, str]] = {}
    for raw in text.splitlines():
        m = _RANK_LINE.match(_MPI_TAG.sub("", raw.strip(), count=1).strip())
        if m:
            ranks[int(m.group(1))] = (m.group(2) or "0", m.group(3))
    if not ranks:
        return None
    first = ranks[min(ranks)][0]
    hosts = [host for group, host in ranks.values() if group == first]
    return len(hosts), len(set(hosts))


def log_collective(filename: str) -> Collective | None:
    """The collective a log file is named after: all_reduce_perf.log, allreduce-16x.txt, ..."""
    stem = filename.lower().replace("-", "_")
    for coll, binary in BINARIES.items():
        if stem.startswith(binary.removesuffix("_perf")) or stem.startswith(str(coll)):
            return coll
    return None


def trial_env(config: Config, base: dict[str, str] | None = None) -> dict[str, str]:
    """The NCCL environment that pins one configuration for a benchmark run."""
    env = dict(base or {})
    impl = config.impl
    if impl.algorithm != "p2p":
        env["NCCL_ALGO"] = NCCL_ALGO_NAME[impl.algorithm]
        env["NCCL_PROTO"] = impl.protocol
        env["NCCL_MIN_NCHANNELS"] = str(config.channels)
        env["NCCL_MAX_NCHANNELS"] = str(config.channels)
    if impl.protocol == "LL128":
        env["NCCL_LL128_NTHREADS"] = str(LL128_THREADS)
    else:
        env["NCCL_NTHREADS"] = str(config.threads)
    if impl.protocol == "Simple":
        env["NCCL_BUFFSIZE"] = str(config.buffsize)
    env.update(transport_env(impl.transport))
    return env


def transport_env(transport: str) -> dict[str, str]:
    # NCCL env docs: NCCL_P2P_LEVEL=SYS allows P2P across the whole PCIe/CPU hierarchy;
    # NCCL_P2P_DISABLE=1 makes intra-node traffic use the SHM transport instead.
    if transport == "shm":
        return {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "0"}
    return {"NCCL_P2P_LEVEL": "SYS"}


def command(
    collective: Collective | str,
    size: int,
    *,
    launcher: list[str] | None = None,
    bindir: str = "",
    iters: int = 20,
    warmup: int = 5,
    dtype: str = "float",
) -> list[str]:
    """argv for one size of one nccl-tests binary (one GPU per process, as under mpirun/srun)."""
    collective = Collective(collective)
    binary = BINARIES[collective]
    path = f"{bindir.rstrip('/')}/{binary}" if bindir else binary
    argv = [*(launcher or []), path, "-b", str(size), "-e", str(size), "-f", "2", "-g", "1",
            "-n", str(iters), "-w", str(warmup), "-c", "0", "-d", dtype]
    if collective in _REDUCING:
        argv += ["-o", "sum"]
    return argv


__all__ = ["BINARIES", "NcclTestsLog", "Row", "command", "log_collective", "log_shape", "parse_log", "transport_env",
           "trial_env"]
