"""heavy queue: make a thumbnail of an uploaded image.

Images are binary PGM (greyscale) so the example needs no imaging library. The output
path is a pure function of the upload id and size, and the write is atomic, so running
the task twice produces the same file: naturally idempotent.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from jobs_platform import PermanentError, ReliableTask
from tasks.jobs import app
from tasks.paths import atomic_write, data_dir


def upload_path(upload_id: int) -> Path:
    return data_dir() / "uploads" / f"{upload_id}.pgm"


def thumbnail_path(upload_id: int, size: int) -> Path:
    return data_dir() / "thumbnails" / f"{upload_id}-{size}.pgm"


#: "P5", width, height, maxval, then exactly one whitespace byte before the pixels (a pixel
#: may itself be a whitespace byte, so the header is matched, not split).
_PGM_HEADER = re.compile(rb"P5\s+(\d+)\s+(\d+)\s+255\s")


def read_pgm(data: bytes) -> tuple[int, int, bytes]:
    header = _PGM_HEADER.match(data)
    if header is None:
        raise PermanentError("not an 8-bit binary PGM image")
    width, height = int(header[1]), int(header[2])
    pixels = data[header.end() : header.end() + width * height]
    if len(pixels) != width * height:
        raise PermanentError("truncated image")
    return width, height, pixels


def make_pgm(width: int, height: int, pixels: bytes) -> bytes:
    return b"P5\n%d %d\n255\n" % (width, height) + pixels


def downscale(width: int, height: int, pixels: bytes, size: int) -> tuple[int, int, bytes]:
    """Nearest-neighbour resize so the longer side is ``size`` pixels."""
    scale = size / max(width, height)
    new_w, new_h = max(1, round(width * scale)), max(1, round(height * scale))
    out = bytearray(new_w * new_h)
    for y in range(new_h):
        row = min(height - 1, int(y / scale)) * width
        for x in range(new_w):
            out[y * new_w + x] = pixels[row + min(width - 1, int(x / scale))]
    return new_w, new_h, bytes(out)


@app.task(
    base=ReliableTask, bind=True, name="tasks.media.resize_image", queue="heavy", max_retries=3
)
def resize_image(self: Any, upload_id: int, size: int = 128) -> str:
    source = upload_path(upload_id)
    if not source.exists():
        raise PermanentError(f"upload {upload_id} not found")
    width, height, pixels = read_pgm(source.read_bytes())
    target = thumbnail_path(upload_id, size)
    atomic_write(target, make_pgm(*downscale(width, height, pixels, size)))
    return str(target)
