"""What tuning publishes: the tuner-plugin table, NCCL_ALGO/NCCL_PROTO, and nccl.conf lines.

Tuner table: NCCL's example tuner plugin (ext-tuner/example) reads
`collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks[,numPipeOps,regBuff]`
from NCCL_TUNER_CONFIG_FILE; lines starting with '#' are comments, byte bounds are inclusive and
parsed with strtoull, -1 in nNodes/nRanks/numPipeOps/regBuff matches anything, and the first
matching row wins. The plugin sets one channel whenever a call matches no row or a row says -1,
so every row carries an explicit channel count and each tuned (collective, nNodes, nRanks) is
covered from 0 bytes to SIZE_MAX. The file is kept correct for users of that plugin (the
conformance kit runs it); jobs get ccltune's own plugin and its table (table.py), which leaves
unmatched calls to NCCL.

nccl.conf carries only what NCCL reads once per process. Never NCCL_ALGO / NCCL_PROTO: they bind
every communicator of the job (a DP-tuned `allreduce:nvlstree,tree,ring` takes NVLS from an 8-GPU
TP group), NCCL before 2.24.3 (msccl-executor-nccl's 2.23.4) has no per-collective syntax, and
naming LL128 forces it on past NCCL's platform check (NCCL env docs, NCCL_PROTO). Per-call choices
go into the tuner table instead (docs/runtimes.md).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..api.common import Collective
from ..api.plan import TaskKey
from .space import Config

SIZE_MAX = (1 << 64) - 1
TUNER_HEADER = "collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff"
MAX_LINE = 255  # the example plugin reads lines into a 256-byte buffer
_TUNER_COLLECTIVES = {
    Collective.ALLREDUCE: "allreduce",
    Collective.ALLGATHER: "allgather",
    Collective.REDUCESCATTER: "reducescatter",
    Collective.BROADCAST: "broadcast",
}
_TUNER_PROTO = {"LL": "ll", "LL128": "ll128", "Simple": "simple"}


@dataclass(frozen=True, slots=True)
class TunerRow:
    collective: str
    min_bytes: int
    max_bytes: int
    algorithm: str
    protocol: str
    channels: int
    nnodes: int
    nranks: int
    num_pipe_ops: int = -1
    reg_buff: int = -1

    def line(self) -> str:
        return ",".join(str(v) for v in (
            self.collective, self.min_bytes, self.max_bytes, self.algorithm, self.protocol,
            self.channels, self.nnodes, self.nranks, self.num_pipe_ops, self.reg_buff))  # fmt: skip


def tuner_rows(choices: Iterable[tuple[TaskKey, Config]], *, cover: bool = True) -> tuple[list[TunerRow], list[str]]:
    """Rows for every NCCL choice, merged where adjacent buckets agree; plus notes.

    With `cover`, each (collective, nNodes, nRanks) group's first row starts at 0 and its last row
    ends at SIZE_MAX, and gaps between buckets are closed by extending the lower row.
    """
    notes: list[str] = []
    groups: dict[tuple[str, int, int], list[tuple[TaskKey, Config]]] = defaultdict(list)
    for key, config in choices:
        coll = _TUNER_COLLECTIVES.get(Collective(key.collective))
        if coll is None:
            continue  # alltoall: point-to-point, the tuner plugin is not consulted
        if config.channels < 1:
            raise ValueError(f"{key.label()}: a tuner row needs an explicit channel count >= 1")
        groups[(coll, key.nodes, key.ranks)].append((key, config))
    rows: list[TunerRow] = []
    for (coll, nodes, ranks), items in sorted(groups.items()):
        items.sort(key=lambda kc: (kc[0].min_bytes, kc[0].role))
        group_rows: list[TunerRow] = []
        for key, config in items:
            row = TunerRow(coll, key.min_bytes, key.max_bytes, _tuner_algo(config),
                           _TUNER_PROTO[config.impl.protocol], config.channels, nodes, ranks)
            if group_rows and row.min_bytes <= group_rows[-1].max_bytes:
                prev = group_rows[-1]
                if (prev.algorithm, prev.protocol, prev.channels) != (row.algorithm, row.protocol, row.channels):
                    notes.append(
                        f"{coll} {ranks} ranks/{nodes} nodes: {key.role} sizes {row.min_bytes}-"
                        f"{min(row.max_bytes, prev.max_bytes)} are shadowed by an earlier row (the "
                        "tuner plugin cannot tell communicators of the same shape apart)"
                    )
                if row.max_bytes <= prev.max_bytes:
                    continue
                row = TunerRow(coll, prev.max_bytes + 1, row.max_bytes, row.algorithm, row.protocol,
                               row.channels, nodes, ranks)
            if cover and group_rows and row.min_bytes > group_rows[-1].max_bytes + 1:
                prev = group_rows[-1]
                group_rows[-1] = _span(prev, prev.min_bytes, row.min_bytes - 1)
            group_rows.append(row)
        if cover:
            group_rows[0] = _span(group_rows[0], 0, group_rows[0].max_bytes)
            group_rows[-1] = _span(group_rows[-1], group_rows[-1].min_bytes, SIZE_MAX)
        rows += merge_rows(group_rows)
    return rows, notes


def _tuner_algo(config: Config) -> str:
    return config.impl.algorithm  # our ids are the plugin's names (tree, nvls_tree, ...)


def _span(row: TunerRow, lo: int, hi: int) -> TunerRow:
    return TunerRow(row.collective, lo, hi, row.algorithm, row.protocol, row.channels, row.nnodes,
                    row.nranks, row.num_pipe_ops, row.reg_buff)


def merge_rows(rows: Sequence[TunerRow]) -> list[TunerRow]:
    """Merge neighbours that touch and choose the same thing."""
    out: list[TunerRow] = []
    for row in rows:
        if out:
            prev = out[-1]
            same = (prev.collective, prev.algorithm, prev.protocol, prev.channels, prev.nnodes,
                    prev.nranks, prev.num_pipe_ops, prev.reg_buff) == (
                    row.collective, row.algorithm, row.protocol, row.channels, row.nnodes,
                    row.nranks, row.num_pipe_ops, row.reg_buff)  # fmt: skip
            if same and row.min_bytes == prev.max_bytes + 1:
                out[-1] = _span(prev, prev.min_bytes, row.max_bytes)
                continue
        out.append(row)
    return out


def render_tuner_csv(rows: Sequence[TunerRow], header: str = "") -> str:
    lines = [f"# {h}" for h in header.splitlines() if h.strip()]
    lines.append(f"# {TUNER_HEADER}")
    lines.append("# first matching row wins; bounds inclusive; channels always explicit")
    for row in rows:
        if row.channels < 1:
            raise ValueError(f"tuner row {row.line()}: channels must be >= 1")
        text = row.line()
        if len(text) > MAX_LINE:
            raise ValueError(f"tuner row longer than {MAX_LINE} characters: {text}")
        lines.append(text)
    return "\n".join(lines) + "\n"


# NCCL settings that bind every communicator of the process to one per-call choice.
PER_CALL_KEYS = frozenset({"NCCL_ALGO", "NCCL_PROTO"})


def check_process_wide(env: dict[str, str]) -> dict[str, str]:
    """`env`, refusing per-call restrictions in process-wide settings (a bug in ccltune, never
    the user's: exit 3)."""
    bad = sorted(PER_CALL_KEYS & env.keys())
    if bad:
        raise AssertionError(f"nccl.conf must not set {', '.join(bad)}: per-call choices belong "
                             "in the tuner table")
    forcing = [k for k, v in env.items() if "LL128" in v.upper()]
    if forcing:
        raise AssertionError(f"nccl.conf must not name LL128 ({', '.join(sorted(forcing))}): "
                             "that forces it past NCCL's platform check")
    return env


def render_nccl_conf(env: dict[str, str], header: str = "") -> str:
    """KEY=VALUE lines for NCCL_CONF_FILE (process environment still overrides them)."""
    lines = [f"# {h}" for h in header.splitlines() if h.strip()]
    check_process_wide(env)
    for k in sorted(env):
        value = env[k]
        if "\n" in value or "=" in k:
            raise ValueError(f"nccl.conf: {k!r} cannot be written as one KEY=VALUE line")
        lines.append(f"{k}={value}")
    return "\n".join(lines) + "\n"


__all__ = [
    "PER_CALL_KEYS",
    "SIZE_MAX",
    "TUNER_HEADER",
    "TunerRow",
    "check_process_wide",
    "merge_rows",
    "render_nccl_conf",
    "render_tuner_csv",
    "tuner_rows",
]
