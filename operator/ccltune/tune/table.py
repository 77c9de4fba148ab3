"""ccltune's tuner table, read by our NCCL tuner plugin (nccl-plugin/, libccltune-tuner.so).

Format (docs/tuner-plugin.md), one record per line, fields separated by blanks:

    ccltune-tuner-table 1
    digest fnv1a64 <16 hex digits> rows <row count>
    nvls-channels 16                      optional; the most NVLS channels NCCL builds here
    # comments and blank lines are ignored (and not digested)
    allreduce 65536 131071 16 2 ring ll128 24 -
    <collective> <min_bytes> <max_bytes> <nRanks> <nNodes> <algorithm> <protocol> <channels> <chunk|->

The digest is FNV-1a 64 over every line after the digest line that is not blank or a comment,
each with its newline. Rows are keyed by the communicator shape as NCCL reports it to the tuner
(nRanks, nNodes; NCCL counts nodes by host hash: hostname and boot id). Within one (collective,
shape), byte ranges are either disjoint or equal; rows with equal ranges are alternatives tried in
file order.

Matching (the plugin's rules; `Table.lookup` is the reference the plugin is tested against): the
range holding nBytes; its first alternative whose cost-table cell NCCL offers (>= 0); none ->
nothing changes (NCCL's own choice, nChannels left 0). Channels are clamped to MAXCHANNELS (64),
NVLS/NVLS-tree to `nvls-channels` (default 32, NCCL's most on any GPU).
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..api.common import Collective
from ..api.errors import InputError
from ..api.plan import TaskKey
from .space import Config

TABLE_FILE = "tuner.table"
TABLE_ENV = "CCLTUNE_TUNER_TABLE"
PLUGIN_LIBRARY = "libccltune-tuner.so"
VERSION = 1
MAX_CHANNELS = 64  # MAXCHANNELS, NCCL src/include/device.h
NVLS_ANY_ARCH = 32  # NVLS_NCHANNELS_SM100, NCCL src/transport/nvls.cc
MAX_LINE = 4096  # bytes, without the newline
MAX_ROWS = 100_000_000
FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK = (1 << 64) - 1

# ncclFunc_t ids, NCCL_ALGO_* ids, NCCL_PROTO_* ids (nccl_common.h, plugin/nccl_tuner.h)
COLLECTIVES = ("broadcast", "reduce", "allgather", "reducescatter", "allreduce")
ALGORITHMS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
PROTOCOLS = ("ll", "ll128", "simple")
_PROTO_OF = {"LL": "ll", "LL128": "ll128", "Simple": "simple"}
_COLL_OF = {
    Collective.ALLREDUCE: "allreduce",
    Collective.ALLGATHER: "allgather",
    Collective.REDUCESCATTER: "reducescatter",
    Collective.BROADCAST: "broadcast",
}


class TableError(InputError):
    """A table the plugin would refuse (it then disables itself for the communicator)."""


def fnv1a64(data: bytes, h: int = FNV_OFFSET) -> int:
    for b in data:
        h = ((h ^ b) * _FNV_PRIME) & _MASK
    return h


def nvls_channels(arch: str, nodes: int) -> int | None:
    """NVLS channels NCCL builds (src/transport/nvls.cc: NVLS_NCHANNELS_SM90 16, SM100 32 across
    nodes, SM100_NVL 24 within one); None where the GPU has no NVLS."""
    if arch == "hopper":
        return 16
    if arch == "blackwell":
        return 32 if nodes > 1 else 24
    return None


@dataclass(frozen=True, slots=True)
class TableRow:
    collective: str
    min_bytes: int
    max_bytes: int
    nranks: int
    nnodes: int
    algorithm: str
    protocol: str
    channels: int
    chunk_bytes: int | None = None

    def line(self) -> str:
        chunk = "-" if self.chunk_bytes is None else str(self.chunk_bytes)
        return (f"{self.collective} {self.min_bytes} {self.max_bytes} {self.nranks} {self.nnodes} "
                f"{self.algorithm} {self.protocol} {self.channels} {chunk}")  # fmt: skip

    def same_choice(self, other: TableRow) -> bool:
        return (self.algorithm, self.protocol, self.channels, self.chunk_bytes) == (
            other.algorithm, other.protocol, other.channels, other.chunk_bytes)  # fmt: skip


def render_table(rows: Sequence[TableRow], *, nvls: int | None = None, comments: Sequence[str] = ()) -> str:
    """The table text; rows in the given order (row N is the N-th row line)."""
    body = ([f"nvls-channels {nvls}"] if nvls is not None else []) + [r.line() for r in rows]
    digest = FNV_OFFSET
    for line in body:
        digest = fnv1a64(line.encode() + b"\n", digest)
    head = [f"ccltune-tuner-table {VERSION}", f"digest fnv1a64 {digest:016x} rows {len(rows)}"]
    notes = [f"# {c}" for text in comments for c in text.splitlines()]
    notes.append("# collective min_bytes max_bytes nRanks nNodes algorithm protocol channels chunk_bytes")
    text = "\n".join([*head, *notes, *body]) + "\n"
    parse_table(text)  # never publish a table the plugin would refuse
    return text


@dataclass(frozen=True, slots=True)
class Match:
    row: int  # 1-based row number
    algorithm: str
    protocol: str
    channels: int  # clamped: what the plugin hands NCCL
    chunk_bytes: int | None


@dataclass
class Table:
    rows: list[TableRow]
    digest: int
    nvls_channels: int = NVLS_ANY_ARCH
    # (collective, nranks, nnodes) -> sorted range starts, and per range (hi, [row numbers])
    _starts: dict[tuple[str, int, int], list[int]] = field(default_factory=dict)
    _ranges: dict[tuple[str, int, int], list[tuple[int, list[int]]]] = field(default_factory=dict)

    def clamp(self, algorithm: str, channels: int) -> int:
        most = self.nvls_channels if algorithm in ("nvls", "nvls_tree") else MAX_CHANNELS
        return min(channels, most)

    def _alternatives(self, coll: str, nbytes: int, nranks: int, nnodes: int) -> list[int]:
        key = (coll, nranks, nnodes)
        starts = self._starts.get(key)
        if not starts:
            return []
        i = bisect.bisect_right(starts, nbytes) - 1
        if i < 0:
            return []
        hi, rows = self._ranges[key][i]
        return rows if nbytes <= hi else []

    def lookup(self, coll: str, nbytes: int, nranks: int, nnodes: int,
               offered: Mapping[tuple[str, str], float]) -> Match | None:  # fmt: skip
        """The plugin's choice; `offered` is NCCL's cost per (algorithm, protocol), -1 = ignored
        (absent cells count as ignored)."""
        for n in self._alternatives(coll, nbytes, nranks, nnodes):
            r = self.rows[n - 1]
            if offered.get((r.algorithm, r.protocol), -1.0) >= 0:
                return Match(n, r.algorithm, r.protocol, self.clamp(r.algorithm, r.channels), r.chunk_bytes)
        return None

    def chunk(self, coll: str, nbytes: int, nranks: int, nnodes: int, algorithm: str, protocol: str) -> int | None:
        """v6 getChunkSize: the chunk of the first alternative with NCCL's selected algorithm/protocol."""
        for n in self._alternatives(coll, nbytes, nranks, nnodes):
            r = self.rows[n - 1]
            if (r.algorithm, r.protocol) == (algorithm, protocol):
                return r.chunk_bytes
        return None


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _fields(line: str) -> list[str]:
    """Split on blanks and tabs only, as the plugin does (str.split would also split on \\x1f ...)."""
    return [f for f in re.split(r"[ \t]+", line) if f]


def _u64(text: str, what: str, where: str) -> int:
    if not _digits(text) or int(text) > _MASK:
        raise TableError(f"{where}: {what} {text!r} is not an unsigned 64-bit integer")
    return int(text)


def _row(fields: list[str], where: str) -> TableRow:
    coll, lo, hi, nranks, nnodes, algo, proto, ch, chunk = fields
    if coll not in COLLECTIVES:
        raise TableError(f"{where}: unknown collective {coll!r}")
    r = TableRow(coll, _u64(lo, "min_bytes", where), _u64(hi, "max_bytes", where), _u64(nranks, "nRanks", where),
                 _u64(nnodes, "nNodes", where), algo, proto, _u64(ch, "channels", where),
                 None if chunk == "-" else _u64(chunk, "chunk", where))  # fmt: skip
    if r.min_bytes > r.max_bytes:
        raise TableError(f"{where}: min_bytes {r.min_bytes} > max_bytes {r.max_bytes}")
    if r.nnodes < 1 or r.nranks < r.nnodes:
        raise TableError(f"{where}: shape {r.nranks} ranks / {r.nnodes} nodes is not nRanks >= nNodes >= 1")
    if algo not in ALGORITHMS:
        raise TableError(f"{where}: unknown algorithm {algo!r}")
    if proto not in PROTOCOLS:
        raise TableError(f"{where}: unknown protocol {proto!r}")
    if not 1 <= r.channels <= MAX_CHANNELS:
        raise TableError(f"{where}: channels {r.channels} is not 1..{MAX_CHANNELS}")
    if r.chunk_bytes == 0:
        raise TableError(f"{where}: chunk size 0 (write '-' for none)")
    return r


def parse_table(text: str) -> Table:
    """The reference reader: the same acceptance rules as the plugin (nccl-plugin/table.c)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) < 2:
        raise TableError("missing the header and digest lines")
    for number, line in enumerate(lines, start=1):
        if "\r" in line or "\0" in line:
            raise TableError(f"line {number}: carriage return or NUL byte in the line")
        if len(line.encode()) > MAX_LINE:
            raise TableError(f"line {number}: longer than {MAX_LINE} bytes")
    if lines[0] != f"ccltune-tuner-table {VERSION}":
        if lines[0].startswith("ccltune-tuner-table "):
            raise TableError(f"line 1: table version {lines[0].split(' ', 1)[1]!r}, the plugin reads version {VERSION}")
        raise TableError("line 1: not a ccltune tuner table")
    d = _fields(lines[1])
    if (len(d) != 5 or d[:2] != ["digest", "fnv1a64"] or d[3] != "rows" or len(d[2]) != 16
            or any(c not in "0123456789abcdef" for c in d[2]) or not _digits(d[4])
            or int(d[4]) > MAX_ROWS):  # fmt: skip
        raise TableError("line 2: expected 'digest fnv1a64 <16 hex digits> rows <count>'")
    declared, digest = int(d[4]), FNV_OFFSET
    rows: list[TableRow] = []
    nvls = NVLS_ANY_ARCH
    for number, line in enumerate(lines[2:], start=3):
        where = f"line {number}"
        if not line or line.startswith("#"):
            continue
        digest = fnv1a64(line.encode() + b"\n", digest)
        fields = _fields(line)
        if fields and fields[0] == "nvls-channels":
            if len(fields) != 2 or not _digits(fields[1]) or not 1 <= int(fields[1]) <= MAX_CHANNELS:
                raise TableError(f"{where}: expected 'nvls-channels <1..{MAX_CHANNELS}>'")
            nvls = int(fields[1])
            continue
        if len(fields) != 9:
            raise TableError(f"{where}: expected 9 fields, got {len(fields)}")
        if len(rows) == declared:
            raise TableError(f"{where}: more rows than the {declared} the digest line declares")
        rows.append(_row(fields, where))
    if len(rows) != declared:
        raise TableError(f"{len(rows)} rows, the digest line declares {declared}")
    if f"{digest:016x}" != d[2]:
        raise TableError(f"digest fnv1a64 {digest:016x}, the file declares {d[2]}")
    return _index(Table(rows, digest, nvls))


def _index(table: Table) -> Table:
    groups: dict[tuple[str, int, int], list[int]] = defaultdict(list)
    for n, r in enumerate(table.rows, start=1):
        groups[(r.collective, r.nranks, r.nnodes)].append(n)
    for key, numbers in groups.items():
        numbers.sort(key=lambda n: (table.rows[n - 1].min_bytes, n))
        ranges: list[tuple[int, list[int]]] = []
        starts: list[int] = []
        for n in numbers:
            r = table.rows[n - 1]
            if starts and starts[-1] == r.min_bytes and ranges[-1][0] == r.max_bytes:
                ranges[-1][1].append(n)
                continue
            if starts and r.min_bytes <= ranges[-1][0]:
                first = ranges[-1][1][0]
                raise TableError(f"rows {first} and {n} overlap ({key[0]}, {key[1]} ranks, {key[2]} nodes): "
                                 "ranges must be equal or disjoint")  # fmt: skip
            starts.append(r.min_bytes)
            ranges.append((r.max_bytes, [n]))
        table._starts[key] = starts
        table._ranges[key] = ranges
    return table


@dataclass
class TableBuild:
    rows: list[TableRow]
    row_of: dict[str, int]  # task key label -> 1-based row realizing it
    notes: list[str]
    nvls: int | None


def table_rows(choices: Iterable[tuple[TaskKey, Config]], arch: str,
               fallbacks: Mapping[str, Config] | None = None) -> TableBuild:  # fmt: skip
    """One row per tuned bucket, merged where neighbours agree; `fallbacks` (by key label) adds a
    second alternative with the same range, which the plugin takes when NCCL does not offer the
    first one (NVLS or CollNet unavailable for the call). Sizes of one shape that an earlier choice
    (in the given order, e.g. the spec's) already claimed keep that row, with a note: the plugin
    sees only the shape, not the role. Sizes with no row run NCCL's own choice. NVLS channels are
    clamped to what NCCL builds on `arch`."""
    notes: list[str] = []
    groups: dict[tuple[str, int, int], list[tuple[TaskKey, Config]]] = defaultdict(list)
    p2p: set[str] = set()
    for key, config in choices:
        coll = _COLL_OF.get(Collective(key.collective))
        if coll is None:
            p2p.add(key.label())
            continue
        groups[(coll, key.ranks, key.nodes)].append((key, config))
    if p2p:
        notes.append(f"{len(p2p)} alltoall bucket(s): NCCL runs them point-to-point and never asks the "
                     "tuner plugin, so their per-call settings have no row (process-wide knobs still apply)")
    ranges: list[list[TableRow]] = []  # alternatives with one byte range
    range_of: dict[str, int] = {}
    caps = []
    for (coll, _ranks, nodes), items in sorted(groups.items()):
        cap = nvls_channels(arch, nodes)
        if cap is not None:
            caps.append(cap)
        claimed: list[tuple[int, int]] = []
        pieces: list[tuple[list[TableRow], str]] = []
        for key, config in items:
            alternatives = [config] + ([fallbacks[key.label()]] if fallbacks and key.label() in fallbacks else [])
            base = [_row_for(coll, key, c, cap, arch, notes) for c in alternatives]
            free = _subtract((key.min_bytes, key.max_bytes), claimed)
            if free != [(key.min_bytes, key.max_bytes)]:
                notes.append(f"{key.label()}: sizes already given a row by another role of the same shape "
                             "(the plugin sees only nRanks/nNodes); that row is kept there")  # fmt: skip
            for lo, hi in free:
                pieces.append(([_span(r, lo, hi) for r in base], key.label()))
            claimed = _union(claimed, (key.min_bytes, key.max_bytes))
        pieces.sort(key=lambda p: p[0][0].min_bytes)
        first = len(ranges)
        for alts, label in pieces:
            prev = ranges[-1] if len(ranges) > first else None
            if (prev is not None and len(prev) == len(alts) and prev[0].max_bytes + 1 == alts[0].min_bytes
                    and all(a.same_choice(b) for a, b in zip(prev, alts, strict=True))):  # fmt: skip
                ranges[-1] = [_span(a, a.min_bytes, b.max_bytes) for a, b in zip(prev, alts, strict=True)]
            else:
                ranges.append(alts)
            range_of.setdefault(label, len(ranges) - 1)
    rows = [r for alts in ranges for r in alts]
    first_row = [1 + sum(len(a) for a in ranges[:i]) for i in range(len(ranges))]
    row_of = {label: first_row[i] for label, i in range_of.items()}
    if rows:
        shapes = ", ".join(f"{c} {r}r{n}n" for c, r, n in sorted(groups))
        alt = sum(len(a) - 1 for a in ranges)
        notes.append(f"tuner table: {len(rows)} rows ({alt} of them fallbacks) for {shapes} (nNodes as NCCL counts "
                     "hosts, assuming one pod per node); every other collective, size and communicator shape runs "
                     "NCCL's own choice")  # fmt: skip
    return TableBuild(rows, row_of, notes, max(caps) if caps else None)


def _row_for(coll: str, key: TaskKey, config: Config, cap: int | None, arch: str, notes: list[str]) -> TableRow:
    algo, channels = config.impl.algorithm, config.channels
    if algo in ("nvls", "nvls_tree") and cap is not None and channels > cap:
        notes.append(f"{key.label()}: {algo} with {channels} channels runs {cap} on {arch} "
                     "(NCCL NVLS_NCHANNELS); the row says so")  # fmt: skip
        channels = cap
    return TableRow(coll, key.min_bytes, key.max_bytes, key.ranks, key.nodes, algo, _PROTO_OF[config.impl.protocol],
                    channels)


def _span(row: TableRow, lo: int, hi: int) -> TableRow:
    return TableRow(row.collective, lo, hi, row.nranks, row.nnodes, row.algorithm, row.protocol, row.channels,
                    row.chunk_bytes)


def _subtract(span: tuple[int, int], taken: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out, (lo, hi) = [], span
    for a, b in sorted(taken):
        if b < lo or a > hi:
            continue
        if a > lo:
            out.append((lo, a - 1))
        lo = max(lo, b + 1)
        if lo > hi:
            return out
    out.append((lo, hi))
    return out


def _union(spans: list[tuple[int, int]], new: tuple[int, int]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for a, b in sorted([*spans, new]):
        if merged and a <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


__all__ = [
    "ALGORITHMS",
    "COLLECTIVES",
    "PLUGIN_LIBRARY",
    "PROTOCOLS",
    "TABLE_ENV",
    "TABLE_FILE",
    "Match",
    "Table",
    "TableBuild",
    "TableError",
    "TableRow",
    "fnv1a64",
    "nvls_channels",
    "parse_table",
    "render_table",
    "table_rows",
]
