"""Array helpers shared by the simulator and the schedule builders."""

from __future__ import annotations

import numpy as np


def sorted_unique(x: np.ndarray) -> np.ndarray:
    """np.unique(x) by sorting: numpy 2.4's default hash path took 7.8 s on 5.7M int64 keys
    where a sort takes 0.4 s (measured here; the 512-GPU synthesis builds such keys). The keys
    here are mostly in order already (CSR rows): timsort ("stable") takes 0.17 s on 25M such
    keys where the default introsort takes 2.1 s, and both are equal on random keys."""
    y = np.sort(x.ravel(), kind="stable")
    if len(y) == 0:
        return y
    keep = np.empty(len(y), dtype=bool)
    keep[0] = True
    np.not_equal(y[1:], y[:-1], out=keep[1:])
    return y[keep]
