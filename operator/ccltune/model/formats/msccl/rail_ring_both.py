"""An AllReduce ring both ways round a rail in 2 S steps (rail_ring_reduce.py's `both`;
docs/synthesis.md, "Session 12: rail AllReduce within 64 steps").

One chunk per server pair: chunk d is reduced on both ways and completed at d and d+1.
- forward (send to s+1): its chain starts at d - hf with the server's partial (`s`), adds
  each server's (`rrs`) and stores the sum L at d (`rrcs`, sent on); at d+1 it adds the sum R
  the backward chain stored there (`rrcs`: complete, sent on) and goes on as an all-gather
  (`rcs`, then `r` at d+1+gf);
- backward (send to s-1): from d+1+hb to d+1 (`rrcs` stores R), then at d (`rrcs`: L + R,
  complete, sent on) and on as an all-gather to d-gb.
hf + hb = gf + gb = S - 2: each chain has S steps, and a chunk waits on ~S hops, where the one-way
ring (reduce then all-gather) chains 2S - 2. Each `rrcs` that completes waits (depid) for the
other way's store on its GPU. Each NIC carries 2S - 2 hops of a chunk, as the one-way ring.
"""

from __future__ import annotations

FORWARD, BACKWARD = 0, 1


class BothWays:
    """Hop counts, and which chunk each step of a way carries on a GPU, for S >= 4 servers."""

    def __init__(self, servers: int) -> None:
        if servers < 4:
            raise ValueError("a ring both ways needs >= 4 servers")
        s = servers
        self.servers = s
        self.reduce_hops = ((s - 1) // 2, (s - 2) // 2)  # (hf, hb)
        self.gather_hops = ((s - 2) // 2, (s - 1) // 2)  # (gf, gb): S steps on each way

    def chunk(self, s: int, way: int, k: int) -> int:
        """The chunk (its pair's first server) step k of `way` carries on server s."""
        h = self.reduce_hops[way]
        return (s + h - k if way == FORWARD else s - 1 - h + k) % self.servers

    def position(self, s: int, way: int, d: int) -> int:
        """The step of `way` on server s that carries chunk d."""
        h = self.reduce_hops[way]
        return (s + h - d if way == FORWARD else d - s + 1 + h) % self.servers

    def kind(self, way: int, k: int) -> str:
        h = self.reduce_hops[way]
        if k == 0:
            return "s"
        if k < h:
            return "rrs"
        if k <= h + 1:
            return "rrcs"  # h: stores the way's sum; h + 1: adds the other way's, complete
        return "rcs" if k < self.servers - 1 else "r"

    def need(self, s: int, d: int) -> int:
        """The step at which server s's rings first read its partial of chunk d."""
        k = self.position(s, FORWARD, d)
        return k if k <= self.reduce_hops[FORWARD] else self.position(s, BACKWARD, d)

    def completes(self, s: int, d: int) -> tuple[int, int]:
        """(way, step) of the step that completes chunk d on server s."""
        k = self.position(s, FORWARD, d)
        if k > self.reduce_hops[FORWARD]:
            return FORWARD, k
        return BACKWARD, self.position(s, BACKWARD, d)


class BothWaysScatter:
    """ReduceScatter's ring both ways round (`lower(..., both=True)` on a ReduceScatter): chunk
    d is reduced forward from d - hf and backward from d + hb (hf + hb = S - 1, every other
    server on one way) and both sums land at d, each way's last step an `rrc` into d's output,
    the later way's waiting (depid) for the earlier one's: ~S/2 chained hops a chunk, not S - 1.
    Per piece the ways hold hf + 1 and hb + 1 steps; the NIC carries S - 1 hops, as one way."""

    def __init__(self, servers: int) -> None:
        if servers < 3:
            raise ValueError("a ReduceScatter ring both ways needs >= 3 servers")
        self.servers = servers
        self.reduce_hops = (servers // 2, (servers - 1) // 2)  # (hf, hb): hf >= hb >= 1

    def chunk(self, s: int, way: int, k: int) -> int:
        """The chunk (its owner server) step k of `way` carries on server s."""
        h = self.reduce_hops[way]
        return (s + h - k if way == FORWARD else s - h + k) % self.servers

    def need(self, s: int, d: int) -> int:
        """The step at which server s's rings first read its partial of chunk d (its own at
        the backward way's last step, which stores first)."""
        hf, hb = self.reduce_hops
        k = (s + hf - d) % self.servers
        back = (d - s + hb) % self.servers
        return min(k, back) if d == s else k if k <= hf else back

    def kind(self, way: int, k: int) -> str:
        return "s" if k == 0 else "rrs" if k < self.reduce_hops[way] else "rrc"


__all__ = ["BACKWARD", "FORWARD", "BothWays", "BothWaysScatter"]
