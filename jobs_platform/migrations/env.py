"""Alembic environment for the platform's tables (configured in code: see db.alembic_config).

The platform's revisions live in their own version table, and autogenerate sees only the
platform's tables: the app may run its own Alembic on the same database.
"""

from __future__ import annotations

from alembic import context

from jobs_platform.db import VERSION_TABLE, engine_for
from jobs_platform.tables import metadata as platform_metadata

config = context.config
# Every table of the platform: autogenerate compares the database with all of them.
target_metadata = platform_metadata


def include_name(name: str | None, type_: str, _parents: object) -> bool:
    """Only the platform's tables: autogenerate must not offer to drop the app's."""
    return type_ != "table" or name in target_metadata.tables


def run_migrations_online() -> None:
    engine = engine_for(config.get_main_option("sqlalchemy.url") or "")
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            version_table=VERSION_TABLE,
            include_name=include_name,
            render_as_batch=connection.dialect.name == "sqlite",
        )
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()


if context.is_offline_mode():
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        include_name=include_name,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
