"""``python -m worker.cli``: the ``aidawork`` command."""

import sys

from worker.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
