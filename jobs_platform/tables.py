"""The platform's tables, for an application's own Alembic on the same database.

The platform migrates its tables itself (``celery -A APP db upgrade``, its revisions in
``jobs_platform_alembic_version``). An application's autogenerate compares *its* metadata
with every table in the database, so without help it proposes to drop the platform's
(``dead_letter_jobs``, ``idempotency_keys``, ``job_outbox``, ``job_batches``, the platform's version
table). Its ``env.py`` passes one of these to ``context.configure`` (docs/deploy.md has
the whole recipe)::

    from jobs_platform.tables import include_name

    context.configure(connection=connection, target_metadata=target_metadata,
                      include_name=include_name)

:data:`metadata` is the platform's own ``MetaData`` (every table it creates), for an app
that wants to read the tables or point a foreign key at them.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

# The models fill Base.metadata: importing them is what makes it complete.
from jobs_platform.batches import model as _batches  # noqa: F401
from jobs_platform.db import VERSION_TABLE, Base
from jobs_platform.deadletter import model as _dead_letters  # noqa: F401
from jobs_platform.idempotency import model as _idempotency  # noqa: F401
from jobs_platform.outbox import model as _outbox  # noqa: F401

#: Every table of the platform's models.
metadata: sa.MetaData = Base.metadata
#: The names an application's migrations must leave alone: the platform's tables and its
#: version table.
PLATFORM_TABLES: frozenset[str] = frozenset({*metadata.tables, VERSION_TABLE})


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """For an application's ``context.configure(include_name=...)``: skip the platform's
    tables (with their indexes and constraints), keep everything else."""
    if type_ == "table":
        return name not in PLATFORM_TABLES
    table = parent_names.get("table_name") if isinstance(parent_names, dict) else None
    return table not in PLATFORM_TABLES


def include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """The same for ``context.configure(include_object=...)`` (for an env.py that already
    filters with include_object)."""
    table_name = name if type_ == "table" else getattr(getattr(obj, "table", None), "name", None)
    return table_name not in PLATFORM_TABLES
