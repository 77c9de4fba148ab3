"""Log lines name their CCLTuning; an announced wait or stop is not logged as an error."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from ccltune.controller import logs

REF = {"apiVersion": "ccltune.io/v1alpha1", "kind": "CCLTuning", "name": "t", "uid": "u", "namespace": "ns"}


@pytest.fixture()
def captured() -> Iterator[tuple[io.StringIO, logging.Handler]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG)
    objects = logging.getLogger("kopf.objects")
    try:
        yield stream, handler
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
        objects.filters[:] = [f for f in objects.filters if not isinstance(f, logs.ExpectedOutcomes)]


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_carry_the_tuning(captured: tuple[io.StringIO, logging.Handler]) -> None:
    stream, _ = captured
    logs.install("json")
    logging.getLogger("kopf.objects").info("Handler 'plan' succeeded.", extra={"k8s_ref": REF})
    token = logs.TUNING.set("other/x")
    try:
        logging.getLogger("ccltune.healing").warning("checked %d", 3)
    finally:
        logs.TUNING.reset(token)
    logging.getLogger("ccltune").info("about nothing")
    first, second, third = lines(stream)
    assert first["tuning"] == {"namespace": "ns", "name": "t"} and first["object"]["kind"] == "CCLTuning"  # type: ignore[index]
    assert first["severity"] == "info" and first["message"] == "Handler 'plan' succeeded."
    assert second["tuning"] == {"namespace": "other", "name": "x"} and second["message"] == "checked 3"
    assert "tuning" not in third


def test_text_lines_are_prefixed(captured: tuple[io.StringIO, logging.Handler]) -> None:
    stream, _ = captured
    logs.install("text")
    logging.getLogger("kopf.objects").info("hello", extra={"k8s_ref": REF})
    assert stream.getvalue().startswith("[ns/t] ") and "INFO kopf.objects: hello" in stream.getvalue()


def test_announced_outcomes_are_lowered_once(captured: tuple[io.StringIO, logging.Handler]) -> None:
    stream, _ = captured
    logs.install("json")
    objects = logging.getLogger("kopf.objects")
    logs.expect("ns", "t", "planning in Job j", logging.INFO)
    objects.error("Handler 'plan' failed temporarily: planning in Job j", extra={"k8s_ref": REF})
    objects.error("Handler 'plan' failed temporarily: planning in Job j", extra={"k8s_ref": REF})  # not announced
    logs.expect("ns", "t", "invalid spec: spec.x", logging.WARNING)
    objects.error("Handler 'plan' failed permanently: something else", extra={"k8s_ref": REF})  # other text
    objects.error("Handler 'plan' failed permanently: invalid spec: spec.x", extra={"k8s_ref": REF})
    got = [(line["severity"], line["message"]) for line in lines(stream)]
    assert got == [
        ("info", "Handler 'plan' waits: planning in Job j"),
        ("error", "Handler 'plan' failed temporarily: planning in Job j"),
        ("error", "Handler 'plan' failed permanently: something else"),
        ("warning", "Handler 'plan' stopped: invalid spec: spec.x"),
    ]
