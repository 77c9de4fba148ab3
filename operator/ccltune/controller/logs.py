"""Operator log lines: JSON or text, each naming the CCLTuning it is about; waiting is no error.

kopf logs every TemporaryError at ERROR ("Handler 'plan' failed temporarily: ...") and every
PermanentError likewise. A pass that waits for a plan Job or for node reports, or that stops on a
user's bad spec, is not an operator error: reconcile announces such an outcome (`expect`) before
raising, and a filter on kopf's object logger lowers exactly that record.
"""

from __future__ import annotations

import json
import logging
import traceback
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

# "namespace/name" of the CCLTuning the current task works on (copied into threads by to_thread).
TUNING: ContextVar[str | None] = ContextVar("ccltune_tuning", default=None)

_expected: dict[tuple[str, str], tuple[str, int]] = {}
_KOPF_OUTCOMES = (" failed temporarily: ", " failed permanently: ")


def expect(namespace: str, name: str, message: str, level: int) -> None:
    """The next kopf failure record of this CCLTuning with `message` is logged at `level`."""
    _expected[(namespace, name)] = (message, level)


def forget(namespace: str, name: str) -> None:
    _expected.pop((namespace, name), None)


def _ref_tuning(record: logging.LogRecord) -> str | None:
    ref = getattr(record, "k8s_ref", None) or {}
    if ref.get("kind") == "CCLTuning" and ref.get("name"):
        return f"{ref.get('namespace') or ''}/{ref['name']}"
    return None


class TuningField(logging.Filter):
    """Adds `tuning` ("namespace/name" or None) to every record a handler emits."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.tuning = _ref_tuning(record) or TUNING.get()
        return True


class ExpectedOutcomes(logging.Filter):
    """On kopf's object logger: lowers the failure records reconcile announced (see module doc)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.ERROR:
            return True
        ref = getattr(record, "k8s_ref", None) or {}
        key = (ref.get("namespace") or "", ref.get("name") or "")
        wanted = _expected.get(key)
        if wanted is None:
            return True
        message = record.getMessage()
        text, level = wanted
        for marker in _KOPF_OUTCOMES:
            head, sep, tail = message.partition(marker)
            if sep and tail == text:
                _expected.pop(key, None)
                verb = "waits" if "temporarily" in marker else "stopped"
                record.msg, record.args = f"{head} {verb}: {tail}", ()
                record.levelno, record.levelname = level, logging.getLevelName(level)
                break
        return True


class JsonLines(logging.Formatter):
    """One JSON object per line: timestamp, severity, logger, message, tuning, object, exception."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "severity": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        tuning = getattr(record, "tuning", None) or _ref_tuning(record)
        if tuning:
            namespace, _, name = tuning.partition("/")
            out["tuning"] = {"namespace": namespace, "name": name}
        ref = getattr(record, "k8s_ref", None)
        if ref:
            out["object"] = {k: v for k, v in ref.items() if v is not None}
        if record.exc_info:
            out["exception"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        return json.dumps(out, default=str)


class TextLines(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        tuning = getattr(record, "tuning", None) or _ref_tuning(record)
        return f"[{tuning}] {line}" if tuning else line


def install(log_format: str) -> None:
    """Our format and the tuning field on the root logger's handlers (kopf's own stream handler)."""
    formatter: logging.Formatter = JsonLines() if log_format == "json" else TextLines()
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter)
        if not any(isinstance(f, TuningField) for f in handler.filters):
            handler.addFilter(TuningField())
    objects = logging.getLogger("kopf.objects")
    if not any(isinstance(f, ExpectedOutcomes) for f in objects.filters):
        objects.addFilter(ExpectedOutcomes())
