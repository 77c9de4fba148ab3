"""report.md, report.json, report.html and the plots, checked by the tools that read them: a
CommonMark+GFM parser, an XML parser, an HTML parser; re-rendering from report.json."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from html.parser import HTMLParser

import pytest
from markdown_it import MarkdownIt

from ccltune.api.common import Collective, Source
from ccltune.api.plan import Choice, Estimate, Plan, PlanTask, TaskKey
from ccltune.publish.configmaps import config_key, render_configmaps
from ccltune.publish.files import with_files
from ccltune.publish.html import render_html
from ccltune.publish.plots import png_plots, svg_plots
from ccltune.publish.report import (
    SUMMARY_PLOT,
    TABLE_HEADER,
    build_report,
    parse_report_json,
    plot_path,
    render_md,
    report_json,
    table_cells,
)
from ccltune.publish.report_files import published_report_files

# The label that broke every table: a raw `|`, plus other characters Markdown gives a meaning to.
NASTY = "mix(2 columns: spread:nvswitch > spread:rail | rail <b>*x*</b> _y_ [z](u) `c` #1 &amp;)"
SIZES = [1 << 16, 1 << 20, 1 << 24, 1 << 28]


def _estimate(size: int, time_us: float, choice: Choice, bound_us: float | None,
              source: Source = Source.SIMULATED) -> Estimate:  # fmt: skip
    algbw = size / time_us / 1e3
    return Estimate(size_bytes=size, time_us=time_us, algbw_gbps=algbw, busbw_gbps=algbw * 15 / 16,
                    source=source, bound_us=bound_us,
                    pct_of_bound=None if bound_us is None else bound_us / time_us * 100, choice=choice)  # fmt: skip


def _plan() -> Plan:
    """Two tasks: one with NCCL default, tuned and synthesized rows (replayed and simulated; both
    sides of a row from one source), one left entirely to NCCL."""
    default = Choice(kind="nccl", algorithm="ring", protocol="LL", channels=4, realized_by="NCCL default")
    tuned = Choice(kind="nccl", algorithm="tree", protocol="LL128", channels=8, realized_by="tuner row 3")
    synth = Choice(kind="msccl", algorithm=NASTY, protocol="Simple", msccl_file="msccl/a|b.xml",
                   realized_by="msccl/a|b.xml")  # fmt: skip
    chosen = [default, tuned, synth, synth]
    key = TaskKey(collective=Collective.ALLGATHER, min_bytes=SIZES[0], max_bytes=SIZES[-1], ranks=16, nodes=2)
    t1 = PlanTask(
        key=key, default=default, chosen=synth, trials=12, notes=["a note with a | pipe"],
        default_estimates=[_estimate(s, 10.0 + s / 4e4, default, 2.0 + s / 1e5,
                                     Source.REPLAYED if c is tuned else Source.SIMULATED)
                           for s, c in zip(SIZES, chosen, strict=True)],
        chosen_estimates=[_estimate(s, (10.0 + s / 4e4) / (1 + i * 0.3), c, 2.0 + s / 1e5,
                                    Source.REPLAYED if c is tuned else Source.SIMULATED)
                          for i, (s, c) in enumerate(zip(SIZES, chosen, strict=True))],
    )  # fmt: skip
    key2 = key.model_copy(update={"collective": Collective.ALLREDUCE, "role": "tp", "nodes": 1})
    plain = [_estimate(s, 20.0 + s / 3e4, default, 2.0 + s / 1e5) for s in SIZES]
    t2 = PlanTask(key=key2, default=default, chosen=default, default_estimates=plain,
                  chosen_estimates=plain)  # fmt: skip
    plan = Plan(name="p|q", cluster="c", runtime="msccl", world_size=16, nodes=2, tasks=[t1, t2],
                env={"NCCL_PROTO": "LL,LL128,Simple"}, notes=["plan note *not emphasis*"])  # fmt: skip
    return with_files(plan, published_report_files(plan, "2 nodes x 8 GPUs"))


def _cell_text(inline) -> str:  # type: ignore[no-untyped-def]
    """A cell's text as rendered; anything but literal text (emphasis, links, HTML) fails."""
    kinds = {child.type for child in inline.children or []}
    assert kinds <= {"text", "code_inline"}, f"cell rendered as {kinds}: {inline.content!r}"
    return "".join(child.content for child in inline.children or [])


def _tables(markdown: str) -> list[list[list[str]]]:
    """Every GFM table as rows of cell texts (header first)."""
    tokens = MarkdownIt("commonmark").enable("table").parse(markdown)
    tables: list[list[list[str]]] = []
    rows: list[list[str]] = []
    row: list[str] = []
    in_cell = False
    for tok in tokens:
        if tok.type == "table_open":
            rows = []
        elif tok.type == "tr_open":
            row = []
        elif tok.type in ("th_open", "td_open", "th_close", "td_close"):
            in_cell = tok.type.endswith("_open")
        elif tok.type == "inline" and in_cell:
            row.append(_cell_text(tok))
        elif tok.type == "tr_close":
            rows.append(row)
        elif tok.type == "table_close":
            tables.append(rows)
    return tables


def test_markdown_tables_parse_to_the_cells_the_report_holds() -> None:
    plan = _plan()
    report = build_report(plan, "2 nodes x 8 GPUs")
    md = render_md(report)
    tables = _tables(md)
    assert len(tables) == len(report.tasks)
    for table, task in zip(tables, report.tasks, strict=True):
        assert table[0] == TABLE_HEADER
        # GFM drops cells past the header's count, so compare contents, not only counts.
        assert table[1:] == table_cells(task)
    # Each source line of a row has exactly the header's number of unescaped separators.
    for line in md.splitlines():
        if line.startswith("| ") and "---" not in line:
            assert len(re.findall(r"(?<!\\)\|", line)) == len(TABLE_HEADER) + 1, line


def test_long_schedule_labels_go_to_a_legend_under_the_table() -> None:
    md = render_md(build_report(_plan(), "x"))
    rows = [line for line in md.splitlines() if line.startswith("| ")]
    assert not any("spread" in line for line in rows)
    tokens = MarkdownIt("commonmark").enable("table").parse(md)
    legend = [t for t in tokens if t.type == "inline" and t.content.startswith("**msccl#1**")]
    assert len(legend) == 1
    text = "".join(c.content for c in legend[0].children or [] if c.type in ("text", "code_inline"))
    assert NASTY in text and "msccl/a|b.xml" in text


def test_report_json_round_trips_and_re_renders_the_same_files() -> None:
    plan = _plan()
    files = {f.path: f.content for f in plan.files}
    report = parse_report_json(files["report.json"])
    assert report == build_report(plan, "2 nodes x 8 GPUs")
    assert render_md(report) == files["report.md"]
    assert report_json(report) == files["report.json"]
    assert svg_plots(report) == {p: c for p, c in files.items() if p.endswith(".svg")}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{", "report.json: not JSON"),
        ('{"tasks": []}', "report.json: missing field plan"),
        ('{"plan": "p", "tasks": [{"rows": [{"size": 1}]}]}', "tasks[0].rows[0]: missing field"),
    ],
)
def test_a_malformed_report_json_names_the_field(text: str, expected: str) -> None:
    with pytest.raises(ValueError, match=re.escape(expected)):
        parse_report_json(text)


def _curves(svg: str) -> set[str]:
    root = ET.fromstring(svg)  # well-formed XML, or this raises
    return {el.get("id", "") for el in root.iter() if el.get("id", "").startswith(("curve-", "speedup-"))}


def _texts(svg: str) -> str:
    return " ".join("".join(el.itertext()) for el in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text"))


def test_each_task_plots_one_curve_per_kind_labelled_with_its_source() -> None:
    plan = _plan()
    report = build_report(plan, "x")
    svgs = svg_plots(report)
    assert set(svgs) == {plot_path(0, report.tasks[0]), plot_path(1, report.tasks[1]), SUMMARY_PLOT}
    first = svgs[plot_path(0, report.tasks[0])]
    assert _curves(first) == {"curve-default", "curve-tuned", "curve-synthesized", "curve-bound"}
    legend = _texts(first)
    assert "NCCL default (replayed+simulated)" in legend  # each row's default shares its source
    assert "tuned NCCL (replayed+simulated)" in legend  # the curve runs through kept defaults
    assert "synthesized MSCCL (simulated)" in legend and "lower bound (cost model)" in legend
    # Left to NCCL: only NCCL's curve and its bound, no empty legend entries.
    assert _curves(svgs[plot_path(1, report.tasks[1])]) == {"curve-default", "curve-bound"}
    assert _curves(svgs[SUMMARY_PLOT]) == {"speedup-1", "speedup-2"}
    assert "geomean" in _texts(svgs[SUMMARY_PLOT])


def test_plots_are_reproducible_and_pngs_are_not_plan_files() -> None:
    a, b = _plan(), _plan()
    assert a.digest == b.digest
    report = build_report(a, "x")
    pngs = png_plots(report)
    assert all(p.startswith(b"\x89PNG") for p in pngs.values()) and len(pngs) == 3
    paths = {f.path for f in a.files}
    assert not any(p.endswith((".png", ".html")) for p in paths)
    assert {p for p in paths if p.endswith(".svg")} == {p.removesuffix(".png") + ".svg" for p in pngs}


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def test_html_is_self_contained_with_the_plots_inline() -> None:
    plan = _plan()
    report = build_report(plan, "x")
    svgs = svg_plots(report)
    html = render_html(report, svgs)
    parser = _Collect()
    parser.feed(html)
    tags = [t for t, _ in parser.tags]
    assert tags.count("svg") == len(svgs) and tags.count("table") == len(report.tasks)
    assert not {"script", "link", "img", "iframe", "object"} & set(tags)
    for _, attrs in parser.tags:
        for name, value in attrs.items():
            if name in ("src", "href", "xlink:href") and value:
                assert value.startswith("#"), (name, value)  # in-document references only
    assert "url(http" not in html and "@import" not in html and "<?xml" not in html
    assert NASTY.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") in html


def test_the_report_configmaps_carry_the_svgs_as_text() -> None:
    plan = _plan()
    manifests = render_configmaps(plan, name="p-ccltune", namespace="default")
    data = {k: v for m in manifests[:-1] for k, v in (m.get("data") or {}).items()}
    svgs = {f.path: f.content for f in plan.files if f.path.endswith(".svg")}
    assert len(svgs) == 3
    for path, svg in svgs.items():
        assert data[config_key(path)] == svg  # plain text in `data`, not packed binaryData


def test_plans_rendered_in_threads_at_once_give_the_same_svgs() -> None:
    # The operator runs build_plan in threads; matplotlib's settings are process-global.
    report = build_report(_plan(), "x")
    expected = svg_plots(report)
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda _: svg_plots(report), range(4)))
    assert all(r == expected for r in results)
