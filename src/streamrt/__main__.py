"""``python -m streamrt``: the ``streamrt`` command where the console script is not installed (a checkout on
``PYTHONPATH``, as on the device machine)."""

import sys

from streamrt.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
