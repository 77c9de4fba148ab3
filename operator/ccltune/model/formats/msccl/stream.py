"""MSCCL XML of a lowered schedule written as it is produced, one <gpu> at a time.

`MscclLowering.render` (writer.py) builds the whole ElementTree first: a 64-rank file holds
~10^5 elements, and the tree costs several times the text. This writes the same bytes (tested
equal to `render`) straight to a text stream, holding one gpu's lines at a time.
"""

from __future__ import annotations

import io
from typing import TextIO

from ....api.common import Collective
from .writer import (
    ALGO_ATTRS,
    GPU_ATTRS,
    STEP_ATTRS,
    TB_ATTRS,
    MscclLowering,
    step_values,
)

# ElementTree's attribute escaping (xml.etree.ElementTree._escape_attrib), so output matches.
_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "\r": "&#13;",
                          "\n": "&#10;", "\t": "&#09;"})  # fmt: skip


# A <step>'s values are integers and fixed names (step types, buffers): nothing to escape, so
# one template formats the line (per-attribute escaping was a tenth of a 64-rank synthesis).
_STEP_LINE = "      <step " + " ".join(f'{k}="{{}}"' for k in STEP_ATTRS) + "/>\n"


def _attrs(keys: tuple[str, ...], values: tuple[object, ...]) -> str:
    pairs = zip(keys, values, strict=True)
    return " ".join(f'{k}="{str(v).translate(_ESCAPES)}"' for k, v in pairs)


def write_lowering(low: MscclLowering, out: TextIO, *, name: str, proto: str,
                   nchannels: int | None = None, min_bytes: int = 0, max_bytes: int | None = None,
                   inplace: bool = False) -> None:  # fmt: skip
    """What `low.render(...)` returns, written to `out`."""
    s, lay = low.schedule, low.layout
    nchannels = low.channels(nchannels)
    algo = (name, proto, nchannels, low.chunks_per_loop, s.nranks,
            str(Collective(s.collective).value), int(inplace), 1, min_bytes,
            0 if max_bytes is None else max_bytes)  # fmt: skip
    if s.nranks == 0:
        out.write(f"<algo {_attrs(ALGO_ATTRS, algo)}/>\n")
        return
    out.write(f"<algo {_attrs(ALGO_ATTRS, algo)}>\n")
    for r in range(s.nranks):
        gpu = _attrs(GPU_ATTRS, (r, lay.i_chunks, lay.o_chunks, len(low.scratch[r])))
        tbs = low.tb_meta[r]
        if not tbs:
            out.write(f"  <gpu {gpu}/>\n")
            continue
        lines = [f"  <gpu {gpu}>\n"]
        for tb, tb_vals in enumerate(tbs):
            head = _attrs(TB_ATTRS, (tb, *tb_vals))
            items = low.items_of[r].get(tb, [])
            if not items:
                lines.append(f"    <tb {head}/>\n")
                continue
            lines.append(f"    <tb {head}>\n")
            step_line = _STEP_LINE.format
            lines += [step_line(*step_values(i, step, dep))
                      for i, (_kind, step, dep) in enumerate(items)]  # fmt: skip
            lines.append("    </tb>\n")
        lines.append("  </gpu>\n")
        out.write("".join(lines))
    out.write("</algo>\n")


def render_lowering(low: MscclLowering, **kw: object) -> str:
    buf = io.StringIO()
    write_lowering(low, buf, **kw)  # type: ignore[arg-type]
    return buf.getvalue()


def write_retitled(text: str, out: TextIO, **attrs: object) -> None:
    """`text` (a rendered file) written to `out` with these `<algo>` attributes replaced: no
    step depends on them, so this is what rendering the lowering with them would write."""
    end = text.index(">") + 1
    head = text[:end]
    for key, value in attrs.items():
        at = head.index(f' {key}="') + len(key) + 3
        head = head[:at] + str(value).translate(_ESCAPES) + head[head.index('"', at) :]
    out.write(head)
    for i in range(end, len(text), _WRITE_SLICE):
        out.write(text[i : i + _WRITE_SLICE])


_WRITE_SLICE = 1 << 22  # characters copied at a time: not a second copy of a large file
