"""Searchers: AutoCCL, TuCCL's MRACO, and grid/random baselines. All seeded."""

from ...api.errors import InputError
from .autoccl import AutoCCLSearcher
from .base import Evaluate, Searcher, SearchResult, Trial
from .baseline import GridSearcher, RandomSearcher
from .mraco import MracoSearcher
from .prior import Prior, visit_order

SEARCHERS = ("autoccl", "mraco", "grid", "random")


def make_searcher(name: str) -> Searcher:
    if name == "autoccl":
        return AutoCCLSearcher()
    if name == "mraco":
        return MracoSearcher()
    if name == "grid":
        return GridSearcher()
    if name == "random":
        return RandomSearcher()
    raise InputError(f"searcher: unknown {name!r} (one of {', '.join(SEARCHERS)})")


__all__ = [
    "SEARCHERS",
    "AutoCCLSearcher",
    "Evaluate",
    "GridSearcher",
    "MracoSearcher",
    "Prior",
    "RandomSearcher",
    "SearchResult",
    "Searcher",
    "Trial",
    "make_searcher",
    "visit_order",
]
