"""One cell of ``hallulog study run``: ``python -m hallulog.cli.study_cell PARENT_PID ARGS...``.

Asks Linux to SIGKILL this process when the study process ``PARENT_PID`` dies (a SIGKILLed
study leaves no run holding its cell's root; the run's workers and servers go with it as they
go with a SIGKILLed ``run``), then is ``hallulog ARGS...`` (``run --config FILE``).
"""

from __future__ import annotations

import signal
import sys

from hallulog.contracts.process import die_with_parent


def main(argv: list[str]) -> int:
    die_with_parent(signal.SIGKILL, int(argv[0]))
    from hallulog.cli.app import main as hallulog_main

    return hallulog_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
