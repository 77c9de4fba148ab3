"""The translation group of a symmetric fabric: ranks as mixed-radix coordinates, added per
dimension modulo its size. Every translation is an automorphism of the fabric, which is what
the synthesized collectives (one root's part moved to every root) and the symmetric simulator
rely on."""

from __future__ import annotations

import numpy as np

# Up to this many ranks, + and - are looked up in n x n tables (8 MiB each at 1024): a gather is
# ~10x faster than the coordinate arithmetic over millions of transfers.
_TABLE_MAX_RANKS = 1024


class Translations:
    """Coordinates innermost dimension first; every rank argument must lie in [0, n)."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.strides = np.concatenate([[1], np.cumprod(self.sizes)[:-1]]).astype(np.int64)
        self.n = int(np.prod(self.sizes))
        self._coords = (np.arange(self.n)[:, None] // self.strides) % self.sizes
        self._add: np.ndarray | None = None
        self._sub: np.ndarray | None = None
        if self.n <= _TABLE_MAX_RANKS:
            c = self._coords
            self._add = self.rank(c[:, None, :] + c[None, :, :]).ravel()
            self._sub = self.rank(c[:, None, :] - c[None, :, :]).ravel()

    def coords(self, ranks: np.ndarray) -> np.ndarray:
        return self._coords[ranks]

    def rank(self, coords: np.ndarray) -> np.ndarray:
        return (coords % self.sizes * self.strides).sum(axis=-1)

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if self._add is not None:
            return self._add[a * self.n + b]
        return self.rank(self.coords(a) + self.coords(b))

    def sub(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if self._sub is not None:
            return self._sub[a * self.n + b]
        return self.rank(self.coords(a) - self.coords(b))
