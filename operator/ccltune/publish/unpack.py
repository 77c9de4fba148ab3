"""Plan files back from their ConfigMap entries: what the pod's `ccltune-unpack` init container runs.

The index is the pointer manifest's `items` (configMap/key/path, `sha256`, and for packed entries
`packing`, `part`, `parts`). The webhook projects every key at its own name into one directory and
passes the items in the init container's arguments (`index_arg`), so the index and the mounted
ConfigMaps come from the same read of the manifest. Plain entries are copied, packed ones
concatenated in part order and gunzipped; every file is checked against its sha256 and written
atomically (temp file + rename).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from ..api.errors import InputError

PACKING = "gzip"
# Linux caps one argv string at 128 KiB (MAX_ARG_STRLEN); the index travels as one argument.
MAX_INDEX_BYTES = 96 * 1024
_INFLATE_BLOCK = 1 << 20  # bytes of output per step: repetitive XML inflates 20x

Read = Callable[[str], bytes | None]  # an entry's bytes by key; None when it is not there


class UnpackError(InputError):
    """One line naming the file and what is wrong with it."""


def is_packed(items: list[dict[str, Any]]) -> bool:
    return any(item.get("packing") for item in items)


def index_arg(items: list[dict[str, Any]]) -> str:
    """The items as one compact argument (the ConfigMap names are the volume's business)."""
    slim = [{k: v for k, v in item.items() if k != "configMap"} for item in items]
    return json.dumps(slim, separators=(",", ":"), sort_keys=True)


def parse_index(text: str) -> list[dict[str, Any]]:
    try:
        items = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UnpackError(f"index: not valid JSON ({exc.msg})") from None
    if not isinstance(items, list):
        raise UnpackError("index: expected a JSON list of items")
    for n, item in enumerate(items):
        if not (isinstance(item, dict) and isinstance(item.get("key"), str)
                and isinstance(item.get("path"), str)):  # fmt: skip
            raise UnpackError(f"index: item {n} needs string fields key and path")
    return items


def by_path(items: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each plan file's entries, parts in order; the index must list every part once."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for item in items:
        groups.setdefault(item["path"], []).append(item)
    out = {}
    for path, group in groups.items():
        rel = PurePosixPath(path)
        if not rel.parts or rel.is_absolute() or ".." in rel.parts or str(rel) != path:
            raise UnpackError(f"{path!r}: not a plain relative path")
        packing = group[0].get("packing")
        if not packing:
            if len(group) != 1:
                raise UnpackError(f"{path}: listed {len(group)} times")
            out[path] = group
            continue
        if packing != PACKING:
            raise UnpackError(f"{path}: unknown packing {packing!r}")
        parts = int(group[0].get("parts", 1))
        numbered = {int(item.get("part", 0)): item for item in group}
        for part in range(parts):
            if part not in numbered:
                raise UnpackError(f"{path}: part {part} of {parts} is missing from the index")
        if len(group) != parts or len(numbered) != parts:
            raise UnpackError(f"{path}: {len(group)} entries for {parts} part(s)")
        out[path] = [numbered[part] for part in range(parts)]
    return out


def extract(path: str, entries: list[dict[str, Any]], read: Read, out: BinaryIO) -> None:
    """Write one plan file's bytes to `out`; raises UnpackError on a missing part or bad digest."""
    digest = hashlib.sha256()
    inflate = zlib.decompressobj(wbits=31) if entries[0].get("packing") else None  # 31: gzip
    for n, entry in enumerate(entries):
        data = read(entry["key"])
        if data is None:
            where = f"part {n} of {len(entries)}" if inflate else "entry"
            raise UnpackError(f"{path}: {where} ({entry['key']}) is missing")
        if inflate is None:
            out.write(data)
            digest.update(data)
            continue
        try:
            while data:
                block = inflate.decompress(data, _INFLATE_BLOCK)
                out.write(block)
                digest.update(block)
                data = inflate.unconsumed_tail
        except zlib.error as exc:
            raise UnpackError(f"{path}: packed data is corrupt ({exc})") from None
    if inflate is not None and (not inflate.eof or inflate.unused_data):
        raise UnpackError(
            f"{path}: packed data is {'truncated' if not inflate.eof else 'too long'}"
        )
    want = entries[0].get("sha256")
    if want and digest.hexdigest() != want:
        raise UnpackError(f"{path}: sha256 {digest.hexdigest()[:12]}... does not match the "
                          f"plan's {want[:12]}...")  # fmt: skip


def read_configmaps(configmaps: list[dict[str, Any]]) -> Read:
    """What the kubelet projects for each key of these ConfigMaps (data as UTF-8, binaryData
    decoded): restores rendered manifests without a cluster."""
    entries: dict[str, bytes] = {}
    for cm in configmaps:
        entries.update({k: v.encode() for k, v in (cm.get("data") or {}).items()})
        entries.update({k: base64.b64decode(v) for k, v in (cm.get("binaryData") or {}).items()})
    return entries.get


def restore(items: list[dict[str, Any]], read: Read) -> dict[str, bytes]:
    """Every plan file's bytes, in memory (tests; `unpack` streams to disk)."""
    files = {}
    for path, entries in by_path(items).items():
        buf = io.BytesIO()
        extract(path, entries, read, buf)
        files[path] = buf.getvalue()
    return files


def unpack(items: list[dict[str, Any]], src: Path, dst: Path) -> list[str]:
    """Write every plan file under dst from the entries projected at src/<key>; paths written."""

    def read(key: str) -> bytes | None:
        try:
            return (src / key).read_bytes()
        except FileNotFoundError:
            return None

    written = []
    for path, entries in by_path(items).items():
        target = dst / path
        target.parent.mkdir(parents=True, exist_ok=True)
        # Hidden temp name in the same directory: MSCCL never sees a half-written schedule.
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                extract(path, entries, read, fh)
            os.chmod(tmp, 0o444)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        written.append(path)
    return written
