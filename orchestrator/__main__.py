"""``python -m orchestrator COMMAND`` (= the ``hallulog`` console script)."""

import sys

from orchestrator.cli import main

if __name__ == "__main__":
    sys.exit(main())
