"""publish/runtime.py: the NCCL under each runtime, which GPUs it drives, and the MSCCL scheduler's
file selection restated from msccl_lifecycle.cc (sorted paths, first match wins)."""

from __future__ import annotations

import pytest

from ccltune.api.ccltuning import PublishOptions
from ccltune.publish.runtime import (
    AlgoMeta,
    RuntimeMismatch,
    algo_meta,
    check_gpus,
    nccl_version,
    publishable_protocol,
    selected_everywhere,
    selected_file,
)

ALGO = (
    '<algo name="x" proto="{proto}" nchannels="1" nchunksperloop="{chunks}" ngpus="{ranks}" '
    'coll="{coll}" inplace="{inplace}" outofplace="1" minBytes="{lo}" maxBytes="{hi}">'
    '<gpu id="0" i_chunks="1" o_chunks="1" s_chunks="0"/></algo>'
)


def meta(path: str, *, coll: str = "allreduce", ranks: int = 8, chunks: int = 8, lo: int = 0,
         hi: int = 0, inplace: int = 0, proto: str = "Simple") -> AlgoMeta:  # fmt: skip
    text = ALGO.format(proto=proto, chunks=chunks, ranks=ranks, coll=coll, inplace=inplace, lo=lo,
                       hi=hi)  # fmt: skip
    return algo_meta(path, text)


def test_the_nccl_version_is_the_runtimes_unless_the_spec_names_a_compatible_one() -> None:
    assert nccl_version(PublishOptions()) == "2.24"
    assert nccl_version(PublishOptions(runtime="msccl")) == "2.23"
    assert nccl_version(PublishOptions(runtime="msccl", nccl_version="2.23.4")) == "2.23.4"
    assert nccl_version(PublishOptions(runtime="nccl", nccl_version="2.30")) == "2.30"
    with pytest.raises(RuntimeMismatch, match=r"^spec\.publish\.ncclVersion: 2\.24 contradicts"):
        nccl_version(PublishOptions(runtime="msccl", nccl_version="2.24"))
    # The wire form round-trips: an unset version stays unset (the plan Job re-reads the spec).
    wire = PublishOptions(runtime="msccl").wire()
    assert nccl_version(PublishOptions.model_validate(wire)) == "2.23"


@pytest.mark.parametrize(
    ("runtime", "gpu", "ok"),
    [("nccl", "H100-SXM5-80GB", True), ("msccl", "A100-SXM4-80GB", True), ("rccl", "MI300X", True),
     ("rccl", "H100-SXM5-80GB", False), ("nccl", "MI300X", False), ("msccl", "MI300X", False),
     ("rccl", "", True)],
)  # fmt: skip
def test_each_runtime_drives_its_vendors_gpus(runtime: str, gpu: str, ok: bool) -> None:
    if ok:
        check_gpus(runtime, gpu)
    else:
        with pytest.raises(RuntimeMismatch, match=r"^spec\.publish\.runtime: "):
            check_gpus(runtime, gpu)


def test_rccl_publishes_no_ll128_files() -> None:
    assert not publishable_protocol("rccl", "LL128")
    assert publishable_protocol("rccl", "LL") and publishable_protocol("msccl", "LL128")


def test_selection_needs_divisible_counts_the_range_and_the_placement() -> None:
    ar = meta("msccl/a.xml", chunks=8, lo=1024, hi=1 << 20)
    assert selected_file([ar], "allreduce", 8, 1 << 16, inplace=False) == "msccl/a.xml"
    assert selected_file([ar], "allreduce", 8, 8, inplace=False) is None  # 4 bf16: not 8 chunks
    assert selected_file([ar], "allreduce", 8, 2 << 20, inplace=False) is None  # over maxBytes
    assert selected_file([ar], "allreduce", 8, 1 << 16, inplace=True) is None  # out-of-place only
    assert selected_file([ar], "allreduce", 16, 1 << 16, inplace=False) is None  # other rank count
    assert selected_file([ar], "allgather", 8, 1 << 16, inplace=False) is None
    odd = meta("msccl/b.xml", chunks=3)
    assert selected_file([odd], "allreduce", 8, 1 << 16, inplace=False) is None  # 32768 % 3


def test_allgather_counts_are_per_rank_times_the_rank_count() -> None:
    # 16 ranks: nBytes = count * 2 * 16; the executor tests (count * 16) % nchunksperloop.
    ag = meta("msccl/ag.xml", coll="allgather", ranks=16, chunks=32)
    assert selected_file([ag], "allgather", 16, 1 << 20, inplace=False) == "msccl/ag.xml"
    ag448 = meta("msccl/ag.xml", coll="allgather", ranks=16, chunks=448)
    assert selected_file([ag448], "allgather", 16, 1 << 20, inplace=False) is None


def test_the_first_file_in_path_order_wins() -> None:
    late = meta("msccl/t1-b.xml", chunks=8)
    early = meta("msccl/t0-a.xml", chunks=8, lo=0, hi=1 << 16)
    metas = [late, early]
    assert selected_file(metas, "allreduce", 8, 1 << 16, inplace=False) == "msccl/t0-a.xml"
    assert not selected_everywhere(metas, late, 1 << 16)
    assert selected_everywhere(metas, late, 1 << 17)


def test_a_file_must_win_for_every_placement_it_declares() -> None:
    both = meta("msccl/b.xml", inplace=1)
    out_only = meta("msccl/a.xml")
    assert selected_everywhere([both], both, 1 << 20)
    # out-of-place calls go to a.xml first: b.xml runs only in-place calls, so it is not claimed
    assert not selected_everywhere([both, out_only], both, 1 << 20)


def test_algo_meta_rejects_a_file_that_is_not_an_algorithm() -> None:
    with pytest.raises(ValueError, match="not <algo>"):
        algo_meta("msccl/x.xml", "<system/>")
