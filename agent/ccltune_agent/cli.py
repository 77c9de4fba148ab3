"""Placeholder entry point until the agent lands (issue: node agent)."""

import sys


def main() -> None:
    print("ccltune-agent: not yet implemented", file=sys.stderr)
    sys.exit(2)
