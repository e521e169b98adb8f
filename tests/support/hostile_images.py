"""Valid and hostile image bytes for the image decoding tests of every layer: a picture in each accepted
format, truncated and corrupt files, a decompression bomb, animations."""

from __future__ import annotations

import io
import struct
import zlib

from PIL import Image


def picture(width: int = 24, height: int = 16) -> Image.Image:
    """An RGB picture with a red square on white, so a round trip can be checked pixel by pixel."""
    image = Image.new("RGB", (width, height), (255, 255, 255))
    image.paste((200, 30, 30), (2, 2, 10, 10))
    return image


def encoded(image: Image.Image, pillow_format: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=pillow_format, **options)
    return buffer.getvalue()


def png_chunk(kind: bytes, payload: bytes) -> bytes:
    """One PNG chunk: length, type, payload, CRC-32 of type + payload."""
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def png_bomb(width: int = 50_000, height: int = 50_000) -> bytes:
    """A PNG whose header declares ``width`` × ``height`` 8-bit grey pixels, with one short compressed row
    of zeros as its data: a few dozen bytes that would decode to ``width * height`` bytes."""
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    data = zlib.compress(b"\x00" * (width + 1), 9)
    return (
        b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", header) + png_chunk(b"IDAT", data) + png_chunk(b"IEND", b"")
    )


def animation(pillow_format: str, frames: int = 3) -> bytes:
    """An animated PNG or WebP of ``frames`` differently coloured 16×16 frames."""
    images = [Image.new("RGB", (16, 16), (40 * i, 100, 200 - 40 * i)) for i in range(frames)]
    return encoded(images[0], pillow_format, save_all=True, append_images=images[1:], duration=100)


def corrupt_jpeg() -> bytes:
    """A JPEG whose first Huffman table (class/id byte, 16 code counts, 3 symbols) is overwritten with 0xEE:
    the counts add up past 256 codes, which libjpeg reports as a broken data stream while decoding."""
    data = encoded(picture(64, 64), "JPEG", quality=90)
    table = data.index(b"\xff\xc4") + 4  # after the DHT marker and its length: class/id, then 16 counts
    return data[:table] + b"\xee" * 20 + data[table + 20 :]
