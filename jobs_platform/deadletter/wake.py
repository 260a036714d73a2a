"""The event that wakes the drainer thread (kept apart: importing it loads nothing)."""

from __future__ import annotations

import threading

#: Set when a dead letter was spooled for the drainer (see :mod:`.worker`).
WAKE_DRAINER = threading.Event()
