"""How a setting is spelled in the environment: ``JOBS_<NAME>`` (pure).

Below the settings table, so the table, its rules and the docs generator all name a
setting's variable the same way without importing each other.
"""

from __future__ import annotations

ENV_PREFIX = "JOBS_"


def env_name(name: str) -> str:
    """``"broker_url"`` -> ``"JOBS_BROKER_URL"``."""
    return ENV_PREFIX + name.upper()
