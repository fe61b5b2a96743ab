"""``python -m meshplan.cli``: the same as the ``meshplan`` command."""

import sys

from meshplan.cli import main

sys.exit(main())
