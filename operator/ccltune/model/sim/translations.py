"""The translation group of a symmetric fabric: ranks as mixed-radix coordinates, added per
dimension modulo its size. Every translation is an automorphism of the fabric, which is what
the synthesized collectives (one root's part moved to every root) and the symmetric simulator
rely on."""

from __future__ import annotations

import numpy as np

# Up to this many ranks, + and - are looked up in n x n tables (8 MiB each at 1024): a gather is
# ~10x faster than the coordinate arithmetic over millions of transfers.
_TABLE_MAX_RANKS = 1024
# Tables per sizes, shared read-only: building them costs ~0.05 s at 512 ranks, and a 512-GPU
# synthesis asked for the same few groups ~240 times (13 s).
_TABLES: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray | None, np.ndarray | None]] = {}
_TABLES_MAX = 8  # at 1024 ranks an entry holds 16 MiB


class Translations:
    """Coordinates innermost dimension first; every rank argument must lie in [0, n)."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.strides = np.concatenate([[1], np.cumprod(self.sizes)[:-1]]).astype(np.int64)
        self.n = int(np.prod(self.sizes))
        key = tuple(self.sizes.tolist())
        hit = _TABLES.get(key)
        if hit is None:
            hit = self._tables()
            if len(_TABLES) >= _TABLES_MAX:
                _TABLES.pop(next(iter(_TABLES)))
            _TABLES[key] = hit
        self._coords, self._add, self._sub = hit

    def _tables(self) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        coords = (np.arange(self.n)[:, None] // self.strides) % self.sizes
        add = sub = None
        if self.n <= _TABLE_MAX_RANKS:
            add = self.rank(coords[:, None, :] + coords[None, :, :]).ravel()
            sub = self.rank(coords[:, None, :] - coords[None, :, :]).ravel()
        for t in (coords, add, sub):
            if t is not None:
                t.setflags(write=False)
        return coords, add, sub

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
