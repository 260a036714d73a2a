"""tests/integration/tools/: real system tools (installed by the session when missing, as
root), and no service (guarded)."""

from tests.support import guards

folder_guard, service_guard = guards.fixtures(guards.TOOLS)
