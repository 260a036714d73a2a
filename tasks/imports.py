"""heavy queue: a big CSV import done as many small jobs with a visible whole.

The monster job (import every row, then reindex search and update a dashboard: one task
that holds a worker for its whole run and starts again at row one when row 48,345 fails)
cut into the right unit of work:

- ``start_import(filename)`` counts the rows of ``<app data>/imports/<filename>`` and sends one
  ``import_chunk`` per ``CHUNK_ROWS`` rows as a **batch** (docs/batches.md), with
  ``on_complete=update_dashboard`` and ``on_success=reindex_search``.
- ``import_chunk(filename, start, stop)`` reads rows ``[start, stop)``, writes them
  ``CHECKPOINT_EVERY`` at a time (one transaction each, keyed by file and row: a repeat
  is ignored) and after each commit checkpoints the next row (docs/checkpoints.md): a
  retry, a redelivery or a replay resumes there.
- A row that does not parse (an amount written ``19,90``) raises :class:`MalformedRow`, a
  ``PermanentError``: its chunk alone is dead-lettered at once (reason ``permanent``), its
  letter carrying the checkpoint; the other chunks carry on. Fix the row in the file and
  replay the letter (``celery -A tasks dlq replay ID``): the chunk resumes from its
  checkpoint, and the batch, its last dead member succeeded, calls ``on_success``.
- ``update_dashboard(batch_id, filename)`` runs once when every chunk has settled (dead
  ones included: the dashboard says what came in), ``reindex_search(batch_id, filename)``
  once when every chunk has succeeded (the index is built from the whole file). Each
  appends one line to ``imports/callbacks.log``, so runs can be counted.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from jobs_platform import Batch, PermanentError, ReliableTask, batch
from tasks import billing
from tasks.jobs import app
from tasks.paths import atomic_write, data_dir

#: Rows per chunk (one member of the batch each).
CHUNK_ROWS = 500
#: Rows per transaction, and a checkpoint after each.
CHECKPOINT_EVERY = 100
COLUMNS = ("row", "order_ref", "sku", "quantity", "amount")
#: An amount as the file must write it: euros with a decimal point and two decimals.
_AMOUNT = re.compile(r"^\d{1,7}\.\d{2}$")

metadata = sa.MetaData()

#: One row per imported CSV row, keyed by the file and the row's number.
import_rows = sa.Table(
    "import_rows",
    metadata,
    sa.Column("file", sa.String(200), primary_key=True),
    sa.Column("row", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("order_ref", sa.String(40), nullable=False),
    sa.Column("sku", sa.String(40), nullable=False),
    sa.Column("quantity", sa.Integer, nullable=False),
    sa.Column("amount_cents", sa.Integer, nullable=False),
)


class MalformedRow(PermanentError):
    """A row of the file does not parse: retrying the same file cannot help."""


def create_schema(engine: sa.Engine) -> None:
    metadata.create_all(engine)


def imports_dir() -> Path:
    return data_dir() / "imports"


def import_path(filename: str) -> Path:
    if not filename or Path(filename).name != filename:
        raise MalformedRow(f"an import names a file of {imports_dir()}, not {filename!r}")
    return imports_dir() / filename


def callbacks_log() -> Path:
    return imports_dir() / "callbacks.log"


# --------------------------------------------------------------------------- the file


def count_rows(path: Path) -> int:
    """Data rows of the file (one per line after the header)."""
    with path.open("rb") as f:
        return max(0, sum(1 for _ in f) - 1)


def read_rows(path: Path, start: int, stop: int) -> Iterator[tuple[int, list[str]]]:
    """``(row number, fields)`` of rows ``[start, stop)``. A row is one line (no quoted
    newline), so skipping to ``start`` counts lines without parsing them."""
    with path.open(newline="") as f:
        lines = itertools.islice(f, 1 + start, 1 + stop)  # line 0 is the header
        for offset, fields in enumerate(csv.reader(lines)):
            yield start + offset, fields


def parse_row(filename: str, number: int, fields: list[str]) -> dict[str, Any]:
    """The row as it is stored; :class:`MalformedRow` if it does not parse."""
    if len(fields) != len(COLUMNS) or fields[0] != str(number):
        raise MalformedRow(f"{filename} row {number}: not a row of {len(COLUMNS)} fields: {fields}")
    _, order_ref, sku, quantity, amount = fields
    if not _AMOUNT.match(amount):
        raise MalformedRow(
            f"{filename} row {number}: amount {amount!r} is not euros with a decimal point"
        )
    if not quantity.isdigit() or int(quantity) < 1:
        raise MalformedRow(f"{filename} row {number}: quantity {quantity!r}")
    euros, cents = amount.split(".")
    return {
        "file": filename,
        "row": number,
        "order_ref": order_ref,
        "sku": sku,
        "quantity": int(quantity),
        "amount_cents": int(euros) * 100 + int(cents),
    }


def write_file(filename: str, rows: int, *, malformed: int | None = None) -> Path:
    """A file of ``rows`` orders; row ``malformed`` with the amount a European spreadsheet
    writes (``19,90``)."""
    text = io.StringIO()
    out = csv.writer(text, lineterminator="\n")
    out.writerow(COLUMNS)
    for n in range(rows):
        amount = "19,90" if n == malformed else f"{1 + (n * 37) % 9000 / 100:.2f}"
        out.writerow((n, f"ORD-{n:06d}", f"SKU-{n % 97:03d}", 1 + n % 5, amount))
    path = import_path(filename)
    atomic_write(path, text.getvalue().encode())
    return path


def fix_amount(filename: str, number: int, amount: str) -> None:
    """Rewrite row ``number``'s amount (what the person who found the bad row does)."""
    path = import_path(filename)
    lines = path.read_text().splitlines(keepends=True)
    [fields] = csv.reader([lines[1 + number]])
    fields[COLUMNS.index("amount")] = amount
    line = io.StringIO()
    csv.writer(line, lineterminator="\n").writerow(fields)
    lines[1 + number] = line.getvalue()
    atomic_write(path, "".join(lines).encode())


# --------------------------------------------------------------------------- the jobs


def start_import(filename: str, *, chunk_rows: int = CHUNK_ROWS) -> Batch:
    """One ``import_chunk`` per ``chunk_rows`` rows of the file, as a batch."""
    total = count_rows(import_path(filename))
    chunks = [
        import_chunk.s(filename, start, min(start + chunk_rows, total))
        for start in range(0, total, chunk_rows)
    ]
    return batch(
        f"import {filename}",
        chunks,
        on_complete=update_dashboard.s(filename),
        on_success=reindex_search.s(filename),
    )


def _insert_ignoring(conn: sa.Connection) -> Any:
    """``INSERT ... ON CONFLICT DO NOTHING`` for many rows (executemany)."""
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    return dialect.insert(import_rows).on_conflict_do_nothing(index_elements=["file", "row"])


@app.task(base=ReliableTask, bind=True, name="tasks.imports.import_chunk", queue="heavy")
def import_chunk(self: Any, filename: str, start: int, stop: int) -> dict[str, int]:
    """Rows ``[start, stop)`` of the file, from the last checkpoint on. Returns where this
    run began (``resumed_at``) and how many rows it wrote."""
    resumed_at = int((self.last_checkpoint() or {"row": start})["row"])
    engine = billing.billing_engine()
    parsed: list[dict[str, Any]] = []
    written = 0
    for number, fields in read_rows(import_path(filename), resumed_at, stop):
        parsed.append(parse_row(filename, number, fields))
        if (number + 1) % CHECKPOINT_EVERY == 0 or number + 1 == stop:
            with engine.begin() as conn:
                conn.execute(_insert_ignoring(conn), parsed)
            written += len(parsed)
            parsed = []
            if number + 1 < stop:  # the last one would be deleted by the success at once
                self.checkpoint({"row": number + 1})
    return {"start": start, "stop": stop, "resumed_at": resumed_at, "rows": written}


def imported(engine: sa.Engine, filename: str) -> tuple[int, int]:
    """Rows of ``filename`` in the table, and their amounts' sum in cents."""
    with engine.connect() as conn:
        rows, cents = conn.execute(
            sa.select(
                sa.func.count(), sa.func.coalesce(sa.func.sum(import_rows.c.amount_cents), 0)
            ).where(import_rows.c.file == filename)
        ).one()
    return int(rows), int(cents)


def _record_run(callback: str, batch_id: str, task_id: str, rows: int) -> None:
    line = json.dumps({"callback": callback, "batch": batch_id, "task_id": task_id, "rows": rows})
    log = callbacks_log()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as out:  # O_APPEND keeps concurrent lines whole
        out.write(line + "\n")


@app.task(base=ReliableTask, bind=True, name="tasks.imports.update_dashboard", queue="fast")
def update_dashboard(self: Any, batch_id: str, filename: str) -> dict[str, Any]:
    """on_complete: what the import brought in, once every chunk has settled."""
    rows, cents = imported(billing.billing_engine(), filename)
    board = {"batch": batch_id, "file": filename, "rows": rows, "amount_cents": cents}
    atomic_write(imports_dir() / f"{filename}.dashboard.json", json.dumps(board).encode())
    _record_run("update_dashboard", batch_id, self.request.id, rows)
    return board


@app.task(base=ReliableTask, bind=True, name="tasks.imports.reindex_search", queue="heavy")
def reindex_search(self: Any, batch_id: str, filename: str) -> dict[str, Any]:
    """on_success: the search index (rows and amount per SKU), once every row is in."""
    c = import_rows.c
    with billing.billing_engine().connect() as conn:
        per_sku = conn.execute(
            sa.select(c.sku, sa.func.count(), sa.func.sum(c.amount_cents))
            .where(c.file == filename)
            .group_by(c.sku)
        ).all()
    index = {sku: {"rows": int(n), "amount_cents": int(s)} for sku, n, s in per_sku}
    atomic_write(imports_dir() / f"{filename}.index.json", json.dumps(index).encode())
    rows = sum(entry["rows"] for entry in index.values())
    _record_run("reindex_search", batch_id, self.request.id, rows)
    return {"batch": batch_id, "skus": len(index), "rows": rows}


__all__ = [
    "CHECKPOINT_EVERY",
    "CHUNK_ROWS",
    "MalformedRow",
    "create_schema",
    "fix_amount",
    "import_chunk",
    "reindex_search",
    "start_import",
    "update_dashboard",
    "write_file",
]
