"""`ccltune-agent`: run (DaemonSet loop), probe (print once), record (capture a node for a fixture)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import socket
import sys
from pathlib import Path

import yaml

from ccltune.topology.nccl_xml import write_nccl_xml

from . import __version__
from .agent import Agent, AgentConfig
from .kube import ConfigError, KubeClient
from .nvml import NvmlSource, RealNvml, RecordingError, ReplayNvml

log = logging.getLogger("ccltune_agent")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--node-name", default=os.environ.get("NODE_NAME"),
                   help="node to report (default: $NODE_NAME, else the hostname)")
    p.add_argument("--sysfs-root", type=Path, default=Path("/"),
                   help="directory holding sys/ (a recording, or the host's / mounted read-only)")
    p.add_argument("--cpuinfo", type=Path,
                   help="CPU facts from this file (default: <sysfs-root>/proc/cpuinfo); in a pod, /proc/cpuinfo")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--nvml-recording", type=Path, help="replay this NVML recording instead of live NVML")
    src.add_argument("--no-nvml", action="store_true", help="do not touch NVML (sysfs facts only)")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ccltune-agent", description=__doc__)
    ap.add_argument("--version", action="version", version=__version__)
    ap.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "INFO"))
    sub = ap.add_subparsers(dest="command")
    run = sub.add_parser("run", help="probe and publish the NodeTopology until SIGTERM (default)")
    _common(run)
    run.add_argument("--interval", type=float, default=300.0, help="seconds between probes (default 300)")
    run.add_argument("--health-addr", default="0.0.0.0:8080", help="HOST:PORT for /healthz and /readyz")
    run.add_argument("--api-server", help="API server URL (default: in-cluster, then KUBECONFIG)")
    run.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    run.add_argument("--token-file", type=Path, help="bearer token file for --api-server")
    run.add_argument("--owner", choices=("node", "pod", "none"), default="node",
                     help="ownerReference of the NodeTopology (default node; see docs/agent.md)")
    run.add_argument("--xml-out", type=Path, help="also write the NCCL topology XML here on every probe")
    run.add_argument("--backoff-max", type=float, default=60.0, help="cap of the API retry backoff, seconds")
    run.add_argument("--once", action="store_true", help="probe and publish once, then exit")
    pr = sub.add_parser("probe", help="probe once and print the NodeTopology spec")
    _common(pr)
    pr.add_argument("--format", choices=("yaml", "json"), default="yaml")
    pr.add_argument("--xml", type=Path, help="write the NCCL topology XML to this file ('-' for stdout)")
    rec = sub.add_parser("record", help="capture what the probes read into DIR (for bug reports/fixtures)")
    _common(rec)
    rec.add_argument("--out", type=Path, required=True, help="new directory to write the recording to")
    return ap


def _nvml(args: argparse.Namespace) -> NvmlSource | None:
    if args.no_nvml:
        return None
    return ReplayNvml(args.nvml_recording) if args.nvml_recording else RealNvml()


def _check_root(root: Path) -> None:
    if not (root / "sys").is_dir():
        raise SystemExit(f"ccltune-agent: --sysfs-root {root}: no sys/ directory below it")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv = ["run", *argv]  # the DaemonSet runs the bare command
    args = parser().parse_args(argv)
    logging.basicConfig(level=str(args.log_level).upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the agent's log
    command = args.command or "run"
    node = args.node_name or socket.gethostname()
    try:
        _check_root(args.sysfs_root)
        if command == "probe":
            _probe(args, node)
        elif command == "record":
            from .record import record
            result = record(args.out, args.sysfs_root, _nvml(args), node, args.cpuinfo)
            print(f"recorded {len(result.touched)} sysfs paths and NVML to {args.out}", file=sys.stderr)
        else:
            sys.exit(_run(args, node))
    except (RecordingError, ConfigError, FileExistsError) as exc:
        print(f"ccltune-agent: {exc}", file=sys.stderr)
        sys.exit(2)


def _probe(args: argparse.Namespace, node: str) -> None:
    from .probe import probe
    result = probe(node, args.sysfs_root, _nvml(args), args.cpuinfo)
    doc = result.spec.wire()
    print(json.dumps(doc, indent=1) if args.format == "json" else yaml.safe_dump(doc, sort_keys=False), end="")
    if args.xml:
        xml = write_nccl_xml(result.spec)
        if str(args.xml) == "-":
            print(xml, end="")
        else:
            args.xml.write_text(xml)
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)


def _run(args: argparse.Namespace, node: str) -> int:
    host, _, port = args.health_addr.rpartition(":")
    try:
        health_port = int(port)
    except ValueError:
        raise ConfigError(f"--health-addr {args.health_addr!r}: expected HOST:PORT") from None
    cfg = AgentConfig(
        node_name=node, sysfs_root=args.sysfs_root, cpuinfo=args.cpuinfo, nvml_recording=args.nvml_recording, no_nvml=args.no_nvml,
        interval=args.interval, health_host=host or "0.0.0.0", health_port=health_port, owner=args.owner,
        pod_name=os.environ.get("POD_NAME"), pod_uid=os.environ.get("POD_UID"),
        pod_namespace=os.environ.get("POD_NAMESPACE"), xml_out=args.xml_out, backoff_cap=args.backoff_max,
        backoff_base=min(1.0, args.backoff_max), once=args.once)
    client = KubeClient.from_environment(args.api_server, args.kubeconfig, args.token_file)
    return asyncio.run(Agent(cfg, client).run())


if __name__ == "__main__":
    main()
