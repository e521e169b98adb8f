"""The synthetic visual task: deterministic pictures whose answer is only in the image, and its data rows."""

from __future__ import annotations

from collections import Counter

from PIL import ImageChops

from grpo_runtime.images import ImageLimits, decode_image
from tiny_models.demo import read_jsonl
from tiny_models.vision_task import (
    BACKGROUND,
    CELL,
    COLOURS,
    IMAGE_SIZE,
    QUESTION,
    blank_image,
    pictures,
    prompt,
    write_task,
)


def test_splits_are_deterministic_and_independent():
    assert pictures("train", 50, seed=0) == pictures("train", 50, seed=0)
    assert pictures("train", 50, seed=0) != pictures("train", 50, seed=1)
    train = {picture.image().tobytes() for picture in pictures("train", 400)}
    test = {picture.image().tobytes() for picture in pictures("test", 400)}
    assert len(train) == 400 and len(test) == 400
    assert not train & test


def test_answers_are_balanced_counts_of_squares():
    split = pictures("test", 400)
    assert Counter(picture.answer for picture in split) == {"1": 100, "2": 100, "3": 100, "4": 100}
    for picture in split:
        cells = {(square.x // CELL, square.y // CELL) for square in picture.squares}
        assert len(cells) == len(picture.squares)  # one square per cell
        for square in picture.squares:
            # each square lies inside its cell, so squares never touch or overlap
            assert square.x // CELL == (square.x + square.side - 1) // CELL
            assert square.y // CELL == (square.y + square.side - 1) // CELL


def test_picture_draws_exactly_its_squares():
    for picture in pictures("train", 20):
        image = picture.image()
        assert image.size == (IMAGE_SIZE, IMAGE_SIZE)
        painted = sum(square.side**2 for square in picture.squares)
        colours = image.getcolors()
        assert sum(count for count, colour in colours if colour != BACKGROUND) == painted
        for square in picture.squares:
            assert image.getpixel((square.x, square.y)) == COLOURS[square.colour]
    assert blank_image().getcolors() == [(IMAGE_SIZE * IMAGE_SIZE, BACKGROUND)]


def test_written_rows_follow_the_text_rows_with_an_image_column(tmp_path):
    paths = write_task(tmp_path, seed=0, splits={"train": 8, "test": 4})
    for name, size in (("train", 8), ("test", 4)):
        rows = read_jsonl(paths[name])
        split = pictures(name, size)
        assert len(rows) == size
        for index, (row, picture) in enumerate(zip(rows, split, strict=True)):
            assert set(row) == {"prompt", "image", "answer"}
            assert row["prompt"] == prompt()
            assert row["prompt"][0]["content"][1]["text"] == QUESTION
            assert row["image"] == f"{name}/{index:05d}.png"
            assert row["answer"] == picture.answer
            data = (tmp_path / row["image"]).read_bytes()
            decoded = decode_image(data, "image/png", ImageLimits(), f"{name}[{index}].image")
            assert ImageChops.difference(decoded.convert("RGB"), picture.image()).getbbox() is None
