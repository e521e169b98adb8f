"""Images of vision rows: TRL's ``image`` (one) or ``images`` (a list) column, loaded and checked.

Each value is one of:

- a path relative to the data file's directory (``"train/00000.png"``), which, symlinks resolved, must stay
  inside that directory (a data file confined to the service's ``data_roots`` cannot name a picture outside
  them); the media type comes from the suffix (``.png``, ``.jpg``/``.jpeg``, ``.webp``);
- a ``data:<media type>;base64,<data>`` URI;
- an image already decoded (a ``datasets`` directory with an ``Image`` column), whose size is still checked.

Every image is decoded by :func:`grpo_runtime.images.decode_image` within the run's :class:`ImageLimits`
(count, bytes, pixels; truncated, corrupt, animated or mislabelled files refused), so the trainer never
hands a decompression bomb to the processor. A prompt whose messages hold ``{"type": "image"}`` placeholders
must hold one per image (TRL fills them in order; without placeholders TRL puts the images before the first
user turn). Failures are :class:`DataError` naming the split, row and column (``images[1]``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from PIL import Image

from grpo_runtime.errors import InvalidArgument
from grpo_runtime.images import MEDIA_TYPES, ImageLimits, check_pixels, decode_base64_image, decode_image
from grpo_runtime.paths import is_within, resolve_path

SUFFIX_MEDIA_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".webp": "image/webp"}
DATA_URI_PREFIX = "data:"
BASE64_MARK = ";base64,"


class ImageColumnError(ValueError):
    """A row's image that cannot be used; the message names the column (``image``, ``images[2]``)."""


def load_row_images(row: dict[str, Any], directory: Path, limits: ImageLimits) -> None:
    """Replace ``row``'s image column values by decoded RGB images (in place), after every check of the
    module docstring; ImageColumnError naming the column."""
    if row.get("image") is not None and row.get("images") is not None:
        raise ImageColumnError("set 'image' or 'images', not both")
    listed = row.get("images") is not None
    if listed:
        values = row["images"]
        if not isinstance(values, list):
            raise ImageColumnError(f"column 'images' must be a list, got {type(values).__name__}")
        columns = [f"images[{k}]" for k in range(len(values))]
    elif row.get("image") is not None:
        values, columns = [row["image"]], ["image"]
    else:
        return
    _check(lambda: limits.check_count(len(values), "images"))
    images = [
        _check(lambda v=v, c=c: _load(v, directory, limits, c)) for v, c in zip(values, columns, strict=True)
    ]
    _check_placeholders(row.get("prompt"), len(images))
    if listed:
        row["images"] = images
    else:
        row["image"] = images[0]


def _check(load):
    try:
        return load()
    except InvalidArgument as exc:
        raise ImageColumnError(f"column {exc.field}: {exc.message}") from exc


def _load(value: Any, directory: Path, limits: ImageLimits, column: str) -> Image.Image:
    if isinstance(value, Image.Image):
        check_pixels(value.size, limits, column)
        return value.convert("RGB")
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"must be a path or a data: URI, got {type(value).__name__}", field=column)
    if value.startswith(DATA_URI_PREFIX):
        media_type, mark, data = value[len(DATA_URI_PREFIX) :].partition(BASE64_MARK)
        if not mark:
            raise InvalidArgument("a data: URI must be data:<media type>;base64,<data>", field=column)
        return decode_base64_image(data, media_type, limits, column).convert("RGB")
    return _load_file(value, directory, limits, column).convert("RGB")


def _load_file(value: str, directory: Path, limits: ImageLimits, column: str) -> Image.Image:
    try:
        path = resolve_path(value, directory)
    except ValueError as exc:
        raise InvalidArgument(f"path {value[:200]!r} {exc}", field=column) from exc
    if not is_within(path, [directory.resolve()]):
        raise InvalidArgument(
            f"path {value[:200]!r} leads outside the data directory {directory.resolve()}", field=column
        )
    media_type = SUFFIX_MEDIA_TYPES.get(path.suffix.lower())
    if media_type is None:
        known = ", ".join(SUFFIX_MEDIA_TYPES)
        raise InvalidArgument(f"{path.name}: the suffix is not one of {known}", field=column)
    if not path.is_file():
        raise InvalidArgument(f"{value[:200]!r} is not a file under {directory.resolve()}", field=column)
    size = path.stat().st_size
    if size > limits.max_image_bytes:
        raise InvalidArgument(
            f"{path.name} is {size} bytes, more than max_image_bytes {limits.max_image_bytes}", field=column
        )
    assert media_type in MEDIA_TYPES
    return decode_image(path.read_bytes(), media_type, limits, column)


def _check_placeholders(prompt: Any, count: int) -> None:
    placeholders = sum(
        1
        for message in prompt or []
        if isinstance(message, Mapping) and isinstance(message.get("content"), list)
        for part in message["content"]
        if isinstance(part, Mapping) and part.get("type") == "image"
    )
    if placeholders and placeholders != count:
        raise ImageColumnError(f"the prompt holds {placeholders} image parts for {count} images")
