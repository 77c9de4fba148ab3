"""What the simulator's resources can carry: links as the GPU drives them, threadblock sides, steps.

Shared by the full engines (simulate.py) and the symmetric one (symmetric_sim.py), which must
charge alike.
"""

from __future__ import annotations

import weakref

import numpy as np

from ...api.cluster import LinkKind
from ..cost.protocols import ProtocolCost
from ..schedule.ir import ScheduleArrays
from .routing import Router


def step_count(nbytes: np.ndarray, protocol: ProtocolCost) -> np.ndarray:
    """Per transfer: protocol steps it takes (each pays `step_latency_us`), at least one."""
    if protocol.step_bytes is None:
        return np.ones(len(nbytes))
    return np.maximum(np.ceil(nbytes / protocol.step_bytes - 1e-9), 1.0)


_NVLINK_MASK: weakref.WeakKeyDictionary[Router, np.ndarray] = weakref.WeakKeyDictionary()


def nvlink_channels(router: Router) -> np.ndarray:
    """Per directed channel: is it an NVLink lane (where SM-driven stores lose payload)?"""
    mask = _NVLINK_MASK.get(router)
    if mask is None:
        kinds = [LinkKind(link.kind) == LinkKind.NVLINK for link in router.topo.links]
        mask = np.repeat(np.asarray(kinds, dtype=bool), 2)
        _NVLINK_MASK[router] = mask
    return mask


def link_capacity(router: Router, protocol: ProtocolCost) -> np.ndarray:
    """Payload bytes/us per directed channel: line rate x wire efficiency x, on NVLink, the
    fraction the GPU's SMs reach (cost/gpu.py)."""
    cap = router.capacity * protocol.efficiency * 1e3
    if protocol.nvlink_efficiency != 1.0:
        cap = np.where(nvlink_channels(router), cap * protocol.nvlink_efficiency, cap)
    return cap


def threadblock_ports(s: ScheduleArrays) -> np.ndarray:
    """[2, n] resource ids: the threadblock side that sends each transfer and the one that
    receives it.

    With `s.tb` a threadblock is (rank, tb): every transfer it sends shares its send side, every
    one it receives its receive side (NCCL: tb = channel; MSCCL read-back: the file's tb). Without
    it, each (channel, peer) has its own threadblock, as MSCCL's lowering gives one per peer and
    channel. A ring threadblock receiving from its left while sending to its right
    (recvReduceSend) runs both sides at full rate.
    """
    n = s.nranks
    src, dst = s.src.astype(np.int64), s.dst.astype(np.int64)
    if s.tb is None:
        ch = s.channel.astype(np.int64)
        send_local, recv_local, span = ch * n + dst, ch * n + src, (int(ch.max()) + 1) * n
    else:
        send_local = recv_local = s.tb.astype(np.int64)
        span = int(send_local.max()) + 1
    keys = np.concatenate([src * span + send_local, (n + dst) * span + recv_local])
    _, ids = np.unique(keys, return_inverse=True)
    return ids.reshape(2, len(src)).astype(np.int32)


def threadblocks_per_rank(s: ScheduleArrays) -> int:
    """SMs the schedule needs: the most threadblocks one rank runs (its send sides or its
    receive sides, whichever are more: an MSCCL threadblock has one of each)."""
    if len(s) == 0:
        return 0
    ports = threadblock_ports(s)
    ranks = np.concatenate([s.src, s.dst]).astype(np.int64)
    side = np.repeat([0, 1], len(s))
    first = np.unique(ports.ravel(), return_index=True)[1]
    per = np.bincount(ranks[first] * 2 + side[first], minlength=2 * s.nranks)
    return int(per.max())
