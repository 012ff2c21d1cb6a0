"""``python -m storage.export {wds,saev,saelens,sft} SRC DST [options]``: see storage/export_cli.py."""

import sys

from storage.export_cli import main

if __name__ == "__main__":
    sys.exit(main())
