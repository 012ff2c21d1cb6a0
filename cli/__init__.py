"""The ``hallulog`` command line: one subcommand per step (``hallulog run``, ``consolidate``,
``validate``, ``evaluate``, ``export``, ``serve``, ...), and the commands on bucket roots."""

from hallulog.cli.app import main

__all__ = ["main"]
