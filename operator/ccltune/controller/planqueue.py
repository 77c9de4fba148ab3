"""The operator's in-process plan slots, shared fairly between CCLTunings.

Plans are CPU-bound and share the GIL, so only a few run at once. A free slot goes to the waiting
plan with the smallest estimated work (ccltune/workload.py), so a short plan never waits behind
a long one that has not started. Aging keeps the long one from starving: every plan that starts
ahead of a waiter credits the waiter with its own work, and waiters are ranked by estimate minus
credit (a deadline of arrival + estimate, counted in work), so plans arriving after a long one
overtake it for at most about its own estimate's worth of work. Plans too big to be worth
waiting for do not come here at all: they run as Jobs (jobs.needs_job).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field


@dataclass
class _Waiter:
    key: tuple[str, str]
    work: int
    order: int
    granted: asyncio.Future[None]
    credit: int = 0

    def rank(self) -> tuple[int, int]:
        return self.work - self.credit, self.order


@dataclass
class PlanQueue:
    slots: int
    running: list[tuple[tuple[str, str], int]] = field(default_factory=list)  # (key, work)
    waiting: list[_Waiter] = field(default_factory=list)
    started: list[tuple[str, str]] = field(default_factory=list)  # start order, newest last
    _order: itertools.count[int] = field(default_factory=itertools.count)

    def ahead(self, work: int) -> int:
        """Plans that would run before a newly queued plan of this work (running ones included)."""
        return len(self.running) + sum(1 for w in self.waiting if w.rank() <= (work, 1 << 62))

    def _start(self, key: tuple[str, str], work: int) -> None:
        self.running.append((key, work))
        self.started = [*self.started[-255:], key]
        for w in self.waiting:
            w.credit += work

    def _release(self, key: tuple[str, str], work: int) -> None:
        self.running.remove((key, work))
        while self.waiting and self._free():
            nxt = min(self.waiting, key=_Waiter.rank)
            self.waiting.remove(nxt)
            self._start(nxt.key, nxt.work)
            nxt.granted.set_result(None)

    def _free(self) -> bool:
        return len(self.running) < self.slots

    @asynccontextmanager
    async def slot(self, key: tuple[str, str], work: int) -> AsyncIterator[None]:
        if self._free() and not self.waiting:
            self._start(key, work)
        else:
            waiter = _Waiter(key, work, next(self._order), asyncio.get_running_loop().create_future())
            self.waiting.append(waiter)
            try:
                await waiter.granted
            except asyncio.CancelledError:
                if waiter in self.waiting:
                    self.waiting.remove(waiter)
                elif waiter.granted.done() and not waiter.granted.cancelled():
                    self._release(key, work)  # granted just as we were cancelled: pass it on
                raise
        try:
            yield
        finally:
            self._release(key, work)
