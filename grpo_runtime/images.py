"""Safe decoding of caller-supplied images (PNG, JPEG, WebP) with Pillow, every limit checked first.

An image arrives as bytes (or a base64 string) with a declared media type. Each check runs before work
proportional to what it bounds, in this order:

1. the media type is one of :data:`MEDIA_TYPES`;
2. the byte size (for base64, the string length, before decoding) is within ``max_image_bytes``;
3. the format sniffed from the leading magic bytes is the declared one;
4. width × height read from the header is within ``max_image_pixels``, before Pillow sees the bytes:
   the size is read here by each format's specification (PNG IHDR, JPEG SOFn, WebP VP8/VP8L/VP8X),
   because Pillow's WebP plugin allocates its canvas while opening, and Pillow's own guard uses the
   process-wide ``Image.MAX_IMAGE_PIXELS``, not a per-call limit. ``Image.open`` then reads the header
   again and its size is checked again. Pillow's global guard stays as a backstop: its
   ``DecompressionBombError`` (and ``DecompressionBombWarning`` where warnings are errors) become the
   same error;
5. one frame only: an animated PNG or WebP, or a multi-picture JPEG (MPO), is refused rather than cut to
   its first frame, so a caller never has frames dropped silently;
6. the pixels decode completely: truncated or corrupt data is refused (Pillow's default
   ``ImageFile.LOAD_TRUNCATED_IMAGES = False`` is assumed; nothing in this project changes it).

Every failure is :class:`~grpo_runtime.errors.InvalidArgument` naming the caller's field path
(``messages[0].content[1].image``); nothing else escapes.
"""

from __future__ import annotations

import base64
import binascii
import io
import struct

from PIL import Image
from pydantic import BaseModel, ConfigDict, Field

from grpo_runtime.errors import InvalidArgument

MiB = 1024 * 1024

# Declared media type → Pillow format name. No other format's parser ever sees caller bytes.
MEDIA_TYPES = {"image/png": "PNG", "image/jpeg": "JPEG", "image/webp": "WEBP"}

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
JPEG_SOI = b"\xff\xd8\xff"


class ImageLimits(BaseModel):
    """What one request may carry in images (service settings)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_images: int = Field(8, ge=0, description="Images in one prompt, over all its messages.")
    max_image_bytes: int = Field(
        8 * MiB,
        ge=1,
        description="Encoded size of one image in bytes (a base64 string may be 4/3 of this, rounded up).",
    )
    max_image_pixels: int = Field(
        4096 * 2048,
        ge=1,
        description="Width × height of one image as its header declares it, checked before decoding "
        "(8,388,608 = a 4096×2048 picture, 32 MiB decoded as RGBA).",
    )

    def check_count(self, count: int, field: str) -> None:
        """InvalidArgument naming ``field`` when ``count`` images exceed ``max_images``."""
        if count > self.max_images:
            raise InvalidArgument(f"{count} images, more than max_images {self.max_images}", field=field)


def decode_base64_image(data: str, media_type: str, limits: ImageLimits, field: str) -> Image.Image:
    """:func:`decode_image` of standard base64 ``data`` (no whitespace, padded); its length is checked
    against ``max_image_bytes`` before anything is decoded."""
    longest = 4 * -(-limits.max_image_bytes // 3)
    if len(data) > longest:
        raise InvalidArgument(
            f"base64 image of {len(data)} characters, more than {longest} "
            f"(max_image_bytes {limits.max_image_bytes})",
            field=field,
        )
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:  # ValueError: a non-ASCII character
        raise InvalidArgument(f"not valid base64: {exc}", field=field) from exc
    return decode_image(raw, media_type, limits, field)


def decode_image(data: bytes, media_type: str, limits: ImageLimits, field: str) -> Image.Image:
    """The image in ``data``, fully decoded (one frame, Pillow's mode as stored), after the checks of the
    module docstring; InvalidArgument naming ``field`` for any failure."""
    expected = MEDIA_TYPES.get(media_type)
    if expected is None:
        raise InvalidArgument(
            f"media type {media_type[:64]!r} is not one of {', '.join(MEDIA_TYPES)}", field=field
        )
    if not data:
        raise InvalidArgument("empty image", field=field)
    if len(data) > limits.max_image_bytes:
        raise InvalidArgument(
            f"image of {len(data)} bytes, more than max_image_bytes {limits.max_image_bytes}", field=field
        )
    detected = sniff_format(data)
    if detected != expected:
        found = f"{detected} data" if detected else "data of no accepted image format"
        raise InvalidArgument(f"declared {media_type} but found {found}", field=field)
    check_pixels(HEADER_SIZE_READERS[expected](data, field), limits, field)
    image = _open(data, expected, field)
    frames = getattr(image, "n_frames", 1)
    if frames != 1:
        raise InvalidArgument(
            f"animated or multi-picture image ({frames} frames); send one frame", field=field
        )
    check_pixels(image.size, limits, field)
    try:
        image.load()
    except Exception as exc:  # Pillow's decoders report bad data as OSError, SyntaxError, ValueError, ...
        raise InvalidArgument(f"corrupt or truncated {expected} image: {exc}", field=field) from exc
    return image


def sniff_format(data: bytes) -> str | None:
    """Pillow's format name for the magic bytes at the start of ``data`` (the same tests Pillow's plugins
    accept on), or None for anything else."""
    if data.startswith(PNG_SIGNATURE):
        return "PNG"
    if data.startswith(JPEG_SOI):
        return "JPEG"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return None


def _png_size(data: bytes, field: str) -> tuple[int, int]:
    """(width, height) of a PNG: big-endian 32-bit words at offsets 16 and 20, in the IHDR chunk that
    must follow the signature."""
    if len(data) < 24 or data[12:16] != b"IHDR":
        raise InvalidArgument("corrupt PNG image: no IHDR chunk after the signature", field=field)
    width, height = struct.unpack(">II", data[16:24])
    return width, height


# JPEG start-of-frame markers SOF0-SOF15; C4 (DHT), C8 (reserved) and CC (DAC) share the range.
JPEG_FRAME_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# Markers without a length field: TEM, RST0-7, SOI.
JPEG_STANDALONE_MARKERS = frozenset({0x01, *range(0xD0, 0xD9)})


def _jpeg_size(data: bytes, field: str) -> tuple[int, int]:
    """(width, height) from a JPEG's first frame header (ITU T.81 B.2.2: marker, 16-bit length, 8-bit
    precision, 16-bit height, 16-bit width), found by walking the marker segments after SOI; each step
    moves forward, so the walk is linear in the bytes."""
    position = 2
    while position + 4 <= len(data):
        if data[position] != 0xFF:
            break
        marker = data[position + 1]
        if marker == 0xFF:  # a fill byte before the marker
            position += 1
            continue
        if marker in JPEG_STANDALONE_MARKERS:
            position += 2
            continue
        if marker in JPEG_FRAME_MARKERS:
            if position + 9 > len(data):
                break
            height, width = struct.unpack(">HH", data[position + 5 : position + 9])
            return width, height
        if marker == 0xDA:  # start of scan before any frame header
            break
        length = int.from_bytes(data[position + 2 : position + 4], "big")
        if length < 2:
            break
        position += 2 + length
    raise InvalidArgument("corrupt JPEG image: no frame header", field=field)


def _webp_size(data: bytes, field: str) -> tuple[int, int]:
    """Canvas (width, height) from a WebP file's first chunk (RFC 9649 §2.5-2.7): ``VP8X`` stores 24-bit
    width-1 and height-1 at offsets 24 and 27; ``VP8L`` 14-bit width-1 and height-1 after its 0x2F
    signature byte at 20; ``VP8 `` 14-bit width and height after the 9D 01 2A start code at 23."""
    chunk = data[12:16]
    if chunk == b"VP8X" and len(data) >= 30:
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        return width, height
    if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    raise InvalidArgument("corrupt WEBP image: no canvas size in its header", field=field)


HEADER_SIZE_READERS = {"PNG": _png_size, "JPEG": _jpeg_size, "WEBP": _webp_size}


def check_pixels(size: tuple[int, int], limits: ImageLimits, field: str) -> None:
    """InvalidArgument naming ``field`` when a (width, height) is empty or over ``max_image_pixels``."""
    width, height = size
    if width < 1 or height < 1:
        raise InvalidArgument(f"image of {width}x{height} pixels has no pixels", field=field)
    if width * height > limits.max_image_pixels:
        raise InvalidArgument(
            f"image of {width}x{height} = {width * height} pixels, more than max_image_pixels "
            f"{limits.max_image_pixels}",
            field=field,
        )


def _open(data: bytes, pillow_format: str, field: str) -> Image.Image:
    """``Image.open`` restricted to ``pillow_format``: reads the header, decodes no pixels."""
    try:
        return Image.open(io.BytesIO(data), formats=[pillow_format])
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise InvalidArgument(f"image over the pixel limit: {exc}", field=field) from exc
    except Exception as exc:  # a malformed header: UnidentifiedImageError, SyntaxError, struct.error, ...
        raise InvalidArgument(f"corrupt {pillow_format} image: {exc}", field=field) from exc


def encode_png(image: Image.Image) -> bytes:
    """``image`` as PNG bytes (lossless: what a service decodes is the picture the caller held)."""
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()
