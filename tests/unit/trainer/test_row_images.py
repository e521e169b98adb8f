"""Vision rows: image columns read from paths under the data file's directory or data: URIs, each decoded
within the run's limits; every hostile image or path is a DataError naming the split, row and column."""

from __future__ import annotations

import base64
import json

import datasets
import pytest
from PIL import Image

from grpo_runtime.images import ImageLimits
from tests.support.hostile_images import animation, corrupt_jpeg, encoded, picture, png_bomb
from trainer_service.config.run_config import DataConfig
from trainer_service.rollout.prompt_images import prompts_with_images
from trainer_service.training.data import DataError, read_split, to_dataset

QUESTION = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many squares?"}]}]
PNG = encoded(picture(), "PNG")


def data_dir(tmp_path, rows, files=None):
    """``tmp_path/data`` holding ``train.jsonl`` of ``rows`` and the ``files`` (name → bytes)."""
    directory = tmp_path / "data"
    directory.mkdir(parents=True)
    for name, content in (files or {}).items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(content)
    (directory / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return directory


def read(directory, **limits):
    config = DataConfig(train=str(directory / "train.jsonl"), images=ImageLimits(**limits))
    return read_split(config, split="train")


def test_paths_and_data_uris_load_as_rgb_pictures(tmp_path):
    uri = "data:image/png;base64," + base64.b64encode(PNG).decode()
    rows = [
        {"prompt": QUESTION, "image": "pics/a.png", "answer": "1"},
        {"prompt": "How many?", "images": [uri, "pics/a.png"], "answer": "2"},
    ]
    loaded = read(data_dir(tmp_path, rows, {"pics/a.png": PNG}))
    assert loaded[0]["image"].mode == "RGB" and loaded[0]["image"].size == picture().size
    assert list(loaded[0]["image"].getdata()) == list(picture().getdata())
    assert [image.size for image in loaded[1]["images"]] == [picture().size] * 2


def test_prompts_get_their_images_as_trl_fills_them(tmp_path):
    placeholders = {"prompt": QUESTION, "image": "a.png", "answer": "1"}
    before_the_question = {"prompt": "How many?", "image": "a.png"}
    for k, row in enumerate((placeholders, before_the_question)):
        directory = data_dir(tmp_path / str(k), [row], {"a.png": PNG})
        [prompt] = prompts_with_images(to_dataset(read(directory), (), split="train"))
        parts = prompt[0]["content"]
        assert [part["type"] for part in parts] == ["image", "text"]
        assert isinstance(parts[0]["image"], Image.Image)
    plain = to_dataset([{"prompt": [{"role": "user", "content": "plain"}]}], (), split="train")
    assert prompts_with_images(plain) == [[{"role": "user", "content": "plain"}]]
    with pytest.raises(DataError, match="train rows mix"):
        to_dataset(
            read(data_dir(tmp_path / "mixed", [placeholders, before_the_question], {"a.png": PNG})),
            (),
            split="train",
        )


@pytest.mark.parametrize(
    ("value", "files", "column", "reason"),
    [
        ("../outside.png", {}, "image", "leads outside the data directory"),
        ("/etc/hostname.png", {}, "image", "leads outside the data directory"),
        ("link.png", {}, "image", "leads outside the data directory"),
        ("missing.png", {}, "image", "is not a file"),
        ("a.gif", {"a.gif": PNG}, "image", "suffix is not one of"),
        ("bomb.png", {"bomb.png": png_bomb()}, "image", "more than max_image_pixels"),
        ("big.png", {"big.png": encoded(picture(400, 400), "PNG")}, "image", "more than max_image_pixels"),
        ("cut.png", {"cut.png": PNG[: len(PNG) // 2]}, "image", "corrupt or truncated"),
        ("bad.jpg", {"bad.jpg": corrupt_jpeg()}, "image", "corrupt or truncated"),
        ("moving.png", {"moving.png": animation("PNG")}, "image", "animated"),
        ("fake.jpg", {"fake.jpg": PNG}, "image", "declared image/jpeg but found PNG data"),
        ("data:image/png;base64,!!!", {}, "image", "not valid base64"),
        ("data:image/gif;base64,AAAA", {}, "image", "media type 'image/gif'"),
        ("data:image/png,AAAA", {}, "image", "data:<media type>;base64,"),
        (7, {}, "image", "must be a path or a data: URI"),
    ],
)
def test_each_hostile_image_names_the_row_and_column(tmp_path, value, files, column, reason):
    directory = data_dir(
        tmp_path, [{"prompt": QUESTION, "answer": "1"}, {"prompt": QUESTION, "image": value}], files
    )
    (tmp_path / "outside.png").write_bytes(PNG)
    (directory / "link.png").symlink_to(tmp_path / "outside.png")
    with pytest.raises(DataError, match=reason) as error:
        read(directory, max_image_pixels=100 * 100)
    assert str(error.value).startswith(f"train row 1: column {column}: ")


def test_counts_sizes_and_placeholders_are_checked(tmp_path):
    many = {"prompt": "How many?", "images": ["a.png"] * 3}
    with pytest.raises(DataError, match=r"train row 0: column images: 3 images, more than max_images 2"):
        read(data_dir(tmp_path / "many", [many], {"a.png": PNG}), max_images=2)
    big = {"prompt": QUESTION, "image": "a.png"}
    with pytest.raises(DataError, match=r"column image: a.png is \d+ bytes, more than max_image_bytes 100"):
        read(data_dir(tmp_path / "big", [big], {"a.png": PNG}), max_image_bytes=100)
    two_for_one = {"prompt": QUESTION, "images": ["a.png", "a.png"]}
    with pytest.raises(DataError, match="the prompt holds 1 image parts for 2 images"):
        read(data_dir(tmp_path / "parts", [two_for_one], {"a.png": PNG}))
    both = {"prompt": QUESTION, "image": "a.png", "images": ["a.png"]}
    with pytest.raises(DataError, match="set 'image' or 'images', not both"):
        read(data_dir(tmp_path / "both", [both], {"a.png": PNG}))
    bad_part = {"prompt": [{"role": "user", "content": [{"type": "video"}]}]}
    with pytest.raises(DataError, match=r"train row 0: column 'prompt' message 0 part 0"):
        read(data_dir(tmp_path / "part", [bad_part]))


def test_a_datasets_directory_keeps_its_decoded_pictures_within_the_limits(tmp_path):
    rows = {"prompt": [QUESTION, QUESTION], "image": [picture(), picture(400, 400)], "answer": ["1", "2"]}
    directory = tmp_path / "saved"
    datasets.Dataset.from_dict(rows).cast_column("image", datasets.Image()).save_to_disk(str(directory))
    with pytest.raises(DataError, match=r"train row 1: column image: image of 400x400 = 160000 pixels"):
        read_split(
            DataConfig(train=str(directory), images=ImageLimits(max_image_pixels=100 * 100)), split="train"
        )
    [first, _] = read_split(DataConfig(train=str(directory)), split="train")
    assert list(first["image"].getdata()) == list(picture().getdata())
