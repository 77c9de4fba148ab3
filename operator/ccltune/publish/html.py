"""report.html: report.md's content in one self-contained page (inline CSS and SVG, no URLs)."""

from __future__ import annotations

import re
from html import escape

from ..api.common import format_size
from .report import (
    INTRO,
    RUNTIME_LINE,
    SUMMARY_PLOT,
    TABLE_ALIGN,
    TABLE_HEADER,
    Report,
    legend_lines,
    plot_path,
    table_cells,
)

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 80em; color: #222;
       background: #fff; line-height: 1.4; padding: 0 1em; }
h1, h2 { font-weight: 600; }
table { border-collapse: collapse; font-size: 0.85em; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; white-space: nowrap; }
th { background: #f0f0f0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr:nth-child(even) td { background: #fafafa; }
figure { margin: 1em 0; }
div.wide { overflow-x: auto; }
figure svg { max-width: 100%; height: auto; }
blockquote { border-left: 3px solid #ccc; margin: 0.5em 0; padding-left: 1em; color: #555; }
code, pre { background: #f4f4f4; padding: 0.1em 0.3em; }
"""

# An SVG file's prolog (XML declaration, DOCTYPE) is not allowed inside HTML: keep <svg ...>;
# its RDF <metadata> names vocabularies by URL, which a self-contained page does without.
_SVG_START = re.compile(r"<svg\b")
_SVG_METADATA = re.compile(r"\s*<metadata>.*?</metadata>", re.DOTALL)


def inline_svg(svg: str) -> str:
    match = _SVG_START.search(svg)
    if match is None:
        raise ValueError("plot is not SVG")
    return _SVG_METADATA.sub("", svg[match.start():], count=1)


def _figure(svg: str, caption: str) -> str:
    return f"<figure>{inline_svg(svg)}<figcaption>{escape(caption)}</figcaption></figure>"


def render_html(report: Report, svgs: dict[str, str]) -> str:
    """svgs: plan-relative plot path -> SVG text (plots.svg_plots)."""
    e = escape
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>ccltune plan {e(report.plan)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>ccltune plan <code>{e(report.plan)}</code></h1>",
        f"<p>Cluster <code>{e(report.cluster)}</code>: {e(report.topology)}</p>",
        f"<p>{e(' '.join(INTRO))}</p>",
        f"<p>Runtime: {e(RUNTIME_LINE.get(report.runtime, report.runtime))}.</p>",
        _figure(svgs[SUMMARY_PLOT], "speedup over NCCL's default per task"),
    ]
    numeric = [a.endswith(":") for a in TABLE_ALIGN]
    for index, task in enumerate(report.tasks):
        key = task.key
        trials = f" · {task.trials} tuning trials" if task.trials else ""
        out += [
            f"<h2>{e(task.title)}</h2>",
            f"<p>Size range {format_size(key.min_bytes)} to {format_size(key.max_bytes)}{trials}</p>",
            _figure(svgs[plot_path(index, task)], f"busbw against message size: {task.title}"),
            '<div class="wide"><table><thead><tr>' + "".join(f"<th>{e(h)}</th>" for h in TABLE_HEADER)
            + "</tr></thead><tbody>",
        ]
        for cells in table_cells(task):
            out.append("<tr>" + "".join(
                f'<td class="num">{e(c)}</td>' if num else f"<td>{e(c)}</td>"
                for c, num in zip(cells, numeric, strict=True)) + "</tr>")  # fmt: skip
        out.append("</tbody></table></div>")
        legend = legend_lines(task)
        if legend:
            out.append("<ul>" + "".join(f"<li><b>{e(tag)}</b> = <code>{e(path)}</code>: {e(label)}</li>"
                                        for tag, path, label in legend) + "</ul>")  # fmt: skip
        out += [f"<blockquote>{e(note)}</blockquote>" for note in task.notes]
    if report.env:
        env = "\n".join(f"{k}={v}" for k, v in sorted(report.env.items()))
        out += ["<h2>NCCL settings</h2>", f"<pre>{e(env)}</pre>"]
    if report.notes:
        out += ["<h2>Notes</h2>", "<ul>" + "".join(f"<li>{e(n)}</li>" for n in report.notes) + "</ul>"]
    out.append("</body></html>")
    return "\n".join(out) + "\n"
