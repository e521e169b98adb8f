"""The synthetic visual task of the tiny vision-language model: how many squares are in a small picture.

A picture is ``IMAGE_SIZE`` × ``IMAGE_SIZE`` pixels on a plain white background, cut into a 2 × 2 grid of
``CELL`` × ``CELL`` cells; 1 to 4 distinct cells hold one filled square each, of side 14-24 pixels at a
random offset inside its cell and of a random colour from ``COLOURS``. A cell is what one image token of a
28-pixel-patch vision tower sees (or of a 14-pixel-patch tower that merges 2 × 2 patches, as Qwen2-VL's
does), so counting means telling filled tokens from empty ones. The question is the same for every
picture, so the answer (``"1"`` to ``"4"``) is only in the image; every split cycles through the four
counts, so answers are balanced and a model that ignores the image is right one time in four.

Deterministic: split ``name`` of task seed ``seed`` draws from ``random.Random(f"{seed}:{name}")``, so the
train, validation and test pictures come from independent streams (a square alone has 11 sides × up to
225 offsets × 6 colours, so pictures practically never repeat; the tests check two splits are disjoint).

``python -m tiny_models.vision_task --data data/vision`` writes ``train.jsonl`` and ``test.jsonl`` beside
``train/`` and ``test/`` folders of PNG files, one row per picture, image paths relative to the data
directory::

    {"prompt": [{"role": "user", "content": [{"type": "image"},
                {"type": "text", "text": "How many squares are in the picture?"}]}],
     "image": "train/00000.png", "answer": "1"}

This is TRL's vision row: a conversational ``prompt`` whose ``{"type": "image"}`` part marks where the
row's ``image`` goes, plus the gold ``answer`` column that rewards read (as in ``data/demo``).
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw

from tiny_models.demo import write_jsonl

IMAGE_SIZE = 56
CELL = 28
GRID = IMAGE_SIZE // CELL
MAX_SQUARES = 4
SIDES = range(14, 25)
BACKGROUND = (255, 255, 255)
COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 160, 60),
    "blue": (40, 70, 220),
    "yellow": (230, 200, 30),
    "purple": (140, 50, 170),
    "black": (20, 20, 20),
}
QUESTION = "How many squares are in the picture?"
SPLITS = {"train": 2000, "test": 400}


@dataclass(frozen=True)
class Square:
    """One filled square: its top-left corner (x, y) in pixels, its side in pixels, its colour name."""

    x: int
    y: int
    side: int
    colour: str


@dataclass(frozen=True)
class Picture:
    """One picture of the task and its answer."""

    squares: tuple[Square, ...]

    @property
    def answer(self) -> str:
        return str(len(self.squares))

    def image(self) -> Image.Image:
        """The RGB picture, ``IMAGE_SIZE`` pixels square."""
        image = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), BACKGROUND)
        draw = ImageDraw.Draw(image)
        for square in self.squares:
            corner = (square.x + square.side - 1, square.y + square.side - 1)
            draw.rectangle([(square.x, square.y), corner], fill=COLOURS[square.colour])
        return image


def prompt() -> list[dict]:
    """The chat prompt of every row: an image part, then the question."""
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]


def blank_image() -> Image.Image:
    """A picture with no square: what a model sees when the image carries no answer."""
    return Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), BACKGROUND)


def _picture(rng: random.Random, count: int) -> Picture:
    cells = rng.sample(range(GRID * GRID), count)
    squares = []
    for cell in sorted(cells):
        side = rng.choice(SIDES)
        row, column = divmod(cell, GRID)
        x = column * CELL + rng.randint(0, CELL - side)
        y = row * CELL + rng.randint(0, CELL - side)
        squares.append(Square(x, y, side, rng.choice(sorted(COLOURS))))
    return Picture(tuple(squares))


def pictures(name: str, size: int, seed: int = 0) -> list[Picture]:
    """Split ``name`` of ``size`` pictures; picture ``i`` has ``i % 4 + 1`` squares."""
    rng = random.Random(f"{seed}:{name}")
    return [_picture(rng, index % MAX_SQUARES + 1) for index in range(size)]


def rows(name: str, pictures_of_split: list[Picture]) -> Iterator[dict]:
    """The dataset rows of a split whose PNG files are ``<name>/<index>.png`` under the data directory."""
    for index, picture in enumerate(pictures_of_split):
        yield {"prompt": prompt(), "image": f"{name}/{index:05d}.png", "answer": picture.answer}


def write_task(data: Path, seed: int = 0, splits: dict[str, int] = SPLITS) -> dict[str, Path]:
    """Write each split's PNG files and JSONL under ``data``; returns split name → JSONL path."""
    paths = {}
    for name, size in splits.items():
        split = pictures(name, size, seed)
        (data / name).mkdir(parents=True, exist_ok=True)
        for index, picture in enumerate(split):
            picture.image().save(data / name / f"{index:05d}.png", format="PNG")
        paths[name] = write_jsonl(rows(name, split), data / f"{name}.jsonl")
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write the tiny vision task's train and test splits.")
    parser.add_argument("--data", type=Path, default=Path("data/vision"), help="dataset directory")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name, path in write_task(args.data, args.seed).items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
