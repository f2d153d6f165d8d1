"""``python -m sibylla`` is the ``sibylla`` command."""

import sys

from sibylla.cli import main

sys.exit(main())
