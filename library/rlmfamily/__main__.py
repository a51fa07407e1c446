"""``python -m rlmfamily``: the ``rlm`` command."""

import sys

from rlmfamily.cli import main

sys.exit(main())
