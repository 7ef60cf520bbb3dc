"""``python -m dataecho.app``: the ``dataecho`` command (what torchrun launches per rank)."""

import sys

from dataecho.app import main

sys.exit(main())
