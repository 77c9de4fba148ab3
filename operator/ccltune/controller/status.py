"""Status bookkeeping: conditions (map keyed by type), Events on transitions, the Ready summary."""

from __future__ import annotations

from typing import Any

from ..api.ccltuning import CCLTuningStatus
from ..api.common import Condition, set_condition

CONDITION_TYPES = ("TopologyReady", "Synthesized", "Tuned", "Published", "Ready")


class StatusBook:
    """Holds the status being built in one reconcile pass and what changed since it was read."""

    def __init__(self, raw_status: dict[str, Any] | None, generation: int | None) -> None:
        raw = dict(raw_status or {})
        try:
            self.status = CCLTuningStatus.model_validate(raw)
        except ValueError:
            self.status = CCLTuningStatus()  # unreadable status: start over rather than fail
        self.generation = generation
        self.transitions: list[Condition] = []

    def condition(self, ctype: str) -> Condition | None:
        return next((c for c in self.status.conditions if c.type == ctype), None)

    def set(self, ctype: str, status: str, reason: str, message: str = "") -> None:
        old = self.condition(ctype)
        new = Condition.model_validate({
            "type": ctype, "status": status, "reason": reason, "message": message[:1024],
            "observedGeneration": self.generation,
        })
        if old is None or (old.status, old.reason) != (status, reason):
            self.transitions.append(new)
        conds = set_condition(self.status.conditions, new)
        order = {t: i for i, t in enumerate(CONDITION_TYPES)}
        self.status.conditions = sorted(conds, key=lambda c: order.get(c.type, 99))

    def wire(self) -> dict[str, Any]:
        self.status.observed_generation = self.generation
        return self.status.wire()
