"""The one error type every topology entry point raises: one line naming the field or node."""

from __future__ import annotations

from ..api.errors import InputError


class TopologyError(InputError):
    """Bad cluster input. The message is one line that names the file, field, line or node."""
