"""``python -m orchestrator COMMAND``: the ``hallulog`` command line."""

import sys

if __name__ == "__main__":
    from hallulog.cli.app import main

    sys.exit(main())
