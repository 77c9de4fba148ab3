"""`ccltune presets` and `ccltune topology`: inspect and export cluster models."""

from __future__ import annotations

from pathlib import Path

import typer
import yaml
from rich.table import Table

from ..topology.export import describe, node_spec, to_astra_yaml
from ..topology.load import load_cluster
from ..topology.nccl_xml import write_nccl_xml
from ..topology.presets import list_presets, load_preset
from ..topology.shape_warnings import shape_warnings
from .common import console, user_errors


def presets() -> None:
    """List the built-in cluster presets."""
    table = Table(
        title="cluster presets (numbers and their sources: docs/topology.md)", title_justify="left"
    )
    for col in ("name", "nodes", "GPUs", "GPU", "fabric"):
        table.add_column(col)
    with user_errors():
        for name in list_presets():
            topo = load_preset(name)
            table.add_row(
                name, str(topo.node_count), str(topo.world_size), topo.gpu_model, describe(topo)
            )
    console.print(table)


def topology(
    cluster: str = typer.Option(
        ..., "--cluster", "-c", help="Preset name or cluster/ASTRA-sim YAML file."
    ),
    astra: Path | None = typer.Option(None, help="Write the ASTRA-sim network YAML here."),
    nccl_xml: Path | None = typer.Option(
        None, help="Write one NCCL topology XML per node into this directory."
    ),
    dump: Path | None = typer.Option(
        None, help="Write the full ClusterTopology (YAML, wire form) here."
    ),
) -> None:
    """Show a cluster's model (dimensions, symmetry) and export it."""
    with user_errors():
        topo = load_cluster(cluster)
        console.print(f"[bold]{topo.name}[/]", highlight=False)
        console.print(f"  {describe(topo)}", highlight=False)
        for warning in shape_warnings(topo):
            console.print(f"[yellow]warning:[/] {warning}", highlight=False)
        if topo.dimensions is not None:
            for i, dim in enumerate(topo.dimensions):
                console.print(
                    f"  dim{i} {dim.name}: {dim.kind} of {dim.size}, {dim.bandwidth_gbps:g} GB/s per GPU per "
                    f"direction, {dim.latency_us:g} µs",
                    highlight=False,
                )
        else:
            console.print(f"  not symmetric: {topo.asymmetry_reason}", highlight=False)
        if astra is not None:
            astra.write_text(to_astra_yaml(topo))
            console.print(f"wrote {astra}")
        if nccl_xml is not None:
            nccl_xml.mkdir(parents=True, exist_ok=True)
            # From agent reports: each node's own file (real bus ids); else synthesized ones.
            reported = {n: v.xml for v in topo.nccl_topology for n in v.nodes}
            for node in topo.nodes:
                (nccl_xml / f"{node.name}.xml").write_text(
                    reported.get(node.name) or write_nccl_xml(node_spec(topo, node.name))
                )
            console.print(f"wrote {len(topo.nodes)} NCCL topology files into {nccl_xml}/")
        if dump is not None:
            dump.write_text(yaml.safe_dump(topo.wire(), sort_keys=False))
            console.print(f"wrote {dump}")


def register(app: typer.Typer) -> None:
    app.command("presets")(presets)
    app.command("topology")(topology)
