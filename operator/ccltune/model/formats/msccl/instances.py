"""Instances of an MSCCL algorithm: the file replicated, each copy on its own threadblocks.

msccl-tools lowers a program with `instances` copies (microsoft/msccl-tools
msccl/language/rank_dag.py `replicate`, as of commit 508469770); the executor then simply runs
the larger file. Copy i of threadblock t becomes threadblock t x instances + i on channel
max_channels x i + chan, dependencies follow their copy, and every chunk splits in `instances`:
nchunksperloop and every buffer grow by that factor, so each copy moves 1/instances of the data.
Chunk offsets of copy i:
- scratch: s_chunks x i + off (msccl-tools: always batched);
- input/output, "interleaved" (its default): off x instances + i x cnt, valid for cnt = 1 only;
- input/output, "batched": len(buffer) x i + off (its allreduce examples use this);
- input/output, "blocked" (ours, for files with cnt > 1 whose buffers are per-rank blocks, e.g.
  allgather's output): within each rank's block of C chunks, block x C x instances + i x C + k.
The result is read back and proven like any other file, so a wrong layout is caught there.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Literal

from ....api.common import Collective
from .writer import MscclFormatError

Mode = Literal["auto", "interleaved", "batched", "blocked"]
_BLOCKED = {Collective.ALLGATHER: ("o",), Collective.REDUCESCATTER: ("i",),
            Collective.ALLTOALL: ("i", "o")}  # fmt: skip


def replicate(xml_text: str, instances: int, mode: Mode = "auto") -> str:
    """The file with `instances` copies of every threadblock (MscclFormatError if it cannot)."""
    if instances < 1:
        raise ValueError(f"instances={instances} must be at least 1")
    root = ET.fromstring(xml_text)
    if instances == 1:
        return xml_text
    try:
        coll = Collective(root.get("coll", ""))
    except ValueError:
        raise MscclFormatError(f"<algo>: coll={root.get('coll')!r} is not a collective") from None
    n = int(root.get("ngpus", "0"))
    nch = int(root.get("nchannels", "1"))
    multi = any(int(s.get("cnt", "1")) > 1 and (s.get("srcbuf") != "s" or s.get("dstbuf") != "s")
                for s in root.iter("step") if s.get("type") != "nop")  # fmt: skip
    if mode == "auto":  # msccl-tools' allreduce examples replicate batched
        if coll in (Collective.ALLREDUCE, Collective.BROADCAST):
            mode = "batched"
        else:
            mode = "blocked" if multi else "interleaved"
    if mode == "interleaved" and multi:
        raise MscclFormatError("interleaved instances need cnt=1 steps on the input and output")
    root.set("nchannels", str(nch * instances))
    root.set("nchunksperloop", str(int(root.get("nchunksperloop", "1")) * instances))
    for g in root.findall("gpu"):
        size = {b: int(g.get(f"{b}_chunks", "0")) for b in ("i", "o", "s")}
        for b in size:
            g.set(f"{b}_chunks", str(size[b] * instances))
        tbs = list(g.findall("tb"))
        for tb in tbs:
            g.remove(tb)
        copies = {}
        for tb in tbs:
            tid = int(tb.get("id", "0"))
            for i in range(instances):
                c = ET.Element("tb", dict(tb.attrib))
                c.set("id", str(tid * instances + i))
                c.set("chan", str(nch * i + int(tb.get("chan", "0"))))
                for st in tb.findall("step"):
                    s = ET.SubElement(c, "step", dict(st.attrib))
                    cnt = int(st.get("cnt", "1"))
                    for side in ("src", "dst"):
                        off = int(st.get(f"{side}off", "-1"))
                        if off >= 0:
                            buf = st.get(f"{side}buf", "i")
                            at = _offset(buf, off, cnt, i, instances, size[buf], mode,
                                         n if buf in _BLOCKED.get(coll, ()) else 1)  # fmt: skip
                            s.set(f"{side}off", str(at))
                    dep = int(st.get("depid", "-1"))
                    if dep >= 0:
                        s.set("depid", str(dep * instances + i))
                copies[tid * instances + i] = c
        for tid in sorted(copies):
            g.append(copies[tid])
    ET.indent(root, space="  ")
    return ET.tostring(root, encoding="unicode") + "\n"


def _offset(buf: str, off: int, cnt: int, i: int, instances: int, length: int, mode: Mode,
            blocks: int) -> int:  # fmt: skip
    if buf == "s" or mode == "batched":
        return length * i + off
    if mode == "interleaved":
        return off * instances + i * cnt
    block = max(length // blocks, 1)
    if off % block + cnt > block:
        raise MscclFormatError(
            f"a step of {cnt} chunks at {buf}[{off}] spans two ranks' blocks of {block}: "
            "its copies would not be contiguous, so the file cannot be replicated"
        )
    return (off // block) * block * instances + i * block + off % block


__all__ = ["Mode", "replicate"]
