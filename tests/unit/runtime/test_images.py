"""Image decoding: valid round trips, and every hostile input refused as INVALID_ARGUMENT naming the field."""

from __future__ import annotations

import base64
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageChops

from grpo_runtime.errors import InvalidArgument
from grpo_runtime.images import MEDIA_TYPES, ImageLimits, decode_base64_image, decode_image, sniff_format
from tests.support.hostile_images import animation, corrupt_jpeg, encoded, picture, png_bomb

FIELD = "messages[0].content[1].image"
LIMITS = ImageLimits()
FORMATS = list(MEDIA_TYPES.items())  # (media type, Pillow format)


def refused(data: bytes, media_type: str, limits: ImageLimits = LIMITS) -> str:
    """The details of the InvalidArgument that decoding raises; they must name the field."""
    with pytest.raises(InvalidArgument) as caught:
        decode_image(data, media_type, limits, FIELD)
    assert caught.value.field == FIELD
    assert caught.value.details.startswith(f"{FIELD}: ")
    return caught.value.message


@pytest.mark.parametrize(("media_type", "pillow_format"), FORMATS)
def test_valid_images_round_trip(media_type, pillow_format):
    original = picture()
    options = {"WEBP": {"lossless": True}, "JPEG": {"quality": 95, "subsampling": 0}}.get(pillow_format, {})
    image = decode_image(encoded(original, pillow_format, **options), media_type, LIMITS, FIELD)
    assert image.format == pillow_format
    assert image.size == original.size
    # per channel (min, max) of |decoded - original|: exact, or within a few levels for lossy JPEG
    extrema = ImageChops.difference(image.convert("RGB"), original).getextrema()
    assert max(high for _, high in extrema) <= (16 if pillow_format == "JPEG" else 0)


def test_lossy_and_extended_webp_headers_decode():
    translucent = picture().convert("RGBA")
    translucent.putalpha(128)
    for image, first_chunk in ((picture(), b"VP8 "), (translucent, b"VP8X")):
        data = encoded(image, "WEBP", quality=80)
        assert data[12:16] == first_chunk
        assert decode_image(data, "image/webp", LIMITS, FIELD).size == (24, 16)


def test_base64_round_trip():
    data = base64.b64encode(encoded(picture(), "PNG")).decode()
    assert decode_base64_image(data, "image/png", LIMITS, FIELD).size == (24, 16)


@pytest.mark.parametrize(("media_type", "pillow_format"), FORMATS)
def test_truncated_images_are_refused(media_type, pillow_format):
    data = encoded(picture(64, 64), pillow_format)
    for cut in (len(data) * 3 // 4, len(data) // 2, 40, 20):
        assert pillow_format in refused(data[:cut], media_type)
    assert "no accepted image format" in refused(data[:2], media_type)  # too short to recognise


def test_truncated_png_names_truncation():
    data = encoded(picture(64, 64), "PNG")
    assert "truncated" in refused(data[: len(data) // 2], "image/png")


def test_corrupt_jpeg_is_refused():
    assert "corrupt or truncated JPEG" in refused(corrupt_jpeg(), "image/jpeg")


def test_png_with_a_bad_checksum_is_refused():
    data = bytearray(encoded(picture(), "PNG"))
    data[-20] ^= 0xFF  # inside the IDAT payload: its CRC no longer matches
    assert "PNG" in refused(bytes(data), "image/png")


def test_decompression_bomb_is_refused_from_its_header():
    bomb = png_bomb(50_000, 50_000)
    assert len(bomb) < 1000
    started = time.perf_counter()
    message = refused(bomb, "image/png")
    assert time.perf_counter() - started < 0.1  # nothing of the 2.5 GB was decoded
    assert "50000x50000" in message and "max_image_pixels" in message


def test_pixel_limit_is_per_call_not_pillows_global():
    assert Image.MAX_IMAGE_PIXELS > 3000 * 3000  # Pillow's global would let it through
    tight = ImageLimits(max_image_pixels=1_000_000)
    assert "more than max_image_pixels 1000000" in refused(png_bomb(3000, 3000), "image/png", tight)
    for media_type, pillow_format in FORMATS:
        data = encoded(picture(1200, 1000), pillow_format)
        assert "1200x1000" in refused(data, media_type, tight)
        assert decode_image(data, media_type, ImageLimits(max_image_pixels=1200 * 1000), FIELD).size == (
            1200,
            1000,
        )


def test_wrong_media_type_is_refused():
    png = encoded(picture(), "PNG")
    assert refused(png, "image/jpeg") == "declared image/jpeg but found PNG data"
    assert refused(png, "image/webp") == "declared image/webp but found PNG data"
    assert "not one of image/png, image/jpeg, image/webp" in refused(encoded(picture(), "GIF"), "image/gif")
    assert "not one of" in refused(png, "image/svg+xml")
    assert refused(encoded(picture(), "GIF"), "image/png") == (
        "declared image/png but found data of no accepted image format"
    )


def test_too_many_bytes_are_refused_before_parsing():
    limits = ImageLimits(max_image_bytes=100)
    assert "more than max_image_bytes 100" in refused(b"\x89PNG" + b"\x00" * 200, "image/png", limits)
    assert refused(b"", "image/png") == "empty image"


def test_base64_is_bounded_before_decoding_and_must_be_valid():
    limits = ImageLimits(max_image_bytes=30)
    with pytest.raises(InvalidArgument, match="41 characters, more than 40") as caught:
        decode_base64_image("A" * 41, "image/png", limits, FIELD)
    assert caught.value.field == FIELD
    for garbage in ("not base64!", "QUJD\nREVG", "QUJ", "ÄÖÜ="):
        with pytest.raises(InvalidArgument, match="not valid base64") as caught:
            decode_base64_image(garbage, "image/png", LIMITS, FIELD)
        assert caught.value.field == FIELD


@pytest.mark.parametrize("pillow_format", ["PNG", "WEBP"])
def test_animated_images_are_refused(pillow_format):
    media_type = f"image/{pillow_format.lower()}"
    assert refused(animation(pillow_format, 3), media_type) == (
        "animated or multi-picture image (3 frames); send one frame"
    )


def test_image_count_limit():
    limits = ImageLimits(max_images=2)
    limits.check_count(2, "messages")
    with pytest.raises(InvalidArgument, match="3 images, more than max_images 2") as caught:
        limits.check_count(3, "messages")
    assert caught.value.field == "messages"


def test_sniffing_matches_pillow():
    for _, pillow_format in FORMATS:
        assert sniff_format(encoded(picture(), pillow_format)) == pillow_format
    assert sniff_format(b"GIF89a") is None


def _mutations(seed_bytes: bytes):
    """Valid bytes with some positions overwritten, cut short, or both."""
    return st.tuples(
        st.lists(st.tuples(st.integers(0, len(seed_bytes) - 1), st.integers(0, 255)), max_size=8),
        st.integers(0, len(seed_bytes)),
    ).map(lambda edit: _apply(seed_bytes, *edit))


def _apply(data: bytes, writes: list[tuple[int, int]], length: int) -> bytes:
    buffer = bytearray(data)
    for position, value in writes:
        buffer[position] = value
    return bytes(buffer[:length])


SEEDS = {media_type: encoded(picture(), pillow_format) for media_type, pillow_format in FORMATS}


def _hostile_inputs(media_type: str, seed: bytes):
    """(media type, bytes): random bytes, the valid ``seed`` mutated, or its first 16 bytes (the magic
    and start of the header) followed by random bytes."""
    return st.tuples(
        st.just(media_type),
        st.one_of(
            st.binary(max_size=512),
            _mutations(seed),
            st.binary(max_size=256).map(lambda tail: seed[:16] + tail),
        ),
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(*(_hostile_inputs(media_type, seed) for media_type, seed in SEEDS.items())))
def test_any_bytes_decode_or_raise_invalid_argument(case):
    media_type, data = case
    try:
        image = decode_image(data, media_type, ImageLimits(max_image_pixels=1 << 16), FIELD)
    except InvalidArgument as error:
        assert error.field == FIELD
    else:
        assert image.size[0] * image.size[1] <= 1 << 16
