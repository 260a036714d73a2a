"""``python -m tasks.demo``: see :mod:`tasks.demo`."""

import sys

from tasks.demo.launch import main

sys.exit(main())
