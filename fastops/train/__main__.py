"""``python -m fastops.train``: see fastops.train.cli."""

import sys

from fastops.train.cli import main

sys.exit(main())
