"""vLLM engine: ``vllm.LLM`` driven step by step, LoRA adapters per version, weights in place.

- Generation: every prompt of every job becomes one engine request (``SamplingParams(n=...)``);
  the loop calls ``LLMEngine.step()`` until all finish, aborting the requests of a job whose
  caller went away. Logprobs use ``logprobs_mode="processed_logprobs"`` with ``logprobs=0`` (the
  sampled token's): log_softmax(logits / T) after penalties — equal to TRL's recomputation
  log_softmax(logits / T) when top_k, top_p, min_p and repetition_penalty are off (TRL's
  defaults); with those filters on, vLLM reports the filtered distribution, as TRL's own vLLM
  path does. So it does for ``min_tokens``: while EOS is masked, a token's logprob is
  log p − log(1 − p_EOS), where TRL (and the HF engine) report log p. The trainer asks for
  ``min_tokens=1``, so each completion's first token differs by that (1.3e-3 with the tiny
  policy, docs/trainer.md); the trainer always corrects for this engine's sampler.
- Partial rollouts (a ``pause`` handed to ``generate``): each sequence is its own engine request
  (n = 1) with cumulative outputs, so the tokens so far are known after every step. When an update
  waits at a segment boundary (every ``pause.segment_tokens`` engine steps, about as many tokens per
  sequence: outputs trail the steps by one, and sequences join the batch at different steps), the
  unfinished requests are aborted, the update applies, and each sequence continues as a new request
  whose prompt is prompt + tokens so far (remaining ``max_tokens``/``min_tokens``, a seed derived
  from the position): vLLM prefills it with the new weights (the prefix cache is reset by a
  state-dict update and keyed by the adapter), so later tokens and their logprobs are the new
  policy's. A stop string that straddles the switch is not seen (each request matches its own text).
- Images (a vision-language model vLLM has a module for): a prompt with pictures goes to vLLM as its
  rendered ids with each picture one placeholder plus the decoded pictures (``PromptImages``); vLLM runs
  the model's processor and expands the placeholders itself, which must give the ids the validator's
  processor gave (checked on every output). The image token carries vLLM's lowest logit bias (−100), so it
  is never sampled: like ``min_tokens``, that makes each reported logprob log p − log(1 − p_image), where
  the HF engine reports log p (p_image: 2e-5 on average, at most 9e-4, over the warm-started tiny LLaVA's
  sampled positions; about 1/vocabulary on a random model). vLLM's prefix cache keys a prompt's blocks
  by its pictures' hashes too, so a group's shared prompt is encoded and prefilled once; every weight
  update resets its encoder cache with the prefix cache (stale image features otherwise).
- LoRA: each pushed adapter is written to ``work_dir/lora/v{version}`` and registered as
  ``LoRARequest(name=f"v{version}", int_id=version)`` before it serves; the previous one is
  then removed.
- State dict: loaded in place in the worker(s) with vLLM's layer-wise ``reload_weights`` (it
  maps HF names onto fused qkv/gate_up parameters and LoRA-wrapped layers), a tied LM head's
  CPU GEMM is rebuilt from the new embeddings (``load_state_dict_in_worker``), then the prefix
  cache (and a vision-language model's encoder cache) is reset so nothing the old weights computed
  is reused.
- Sleep on CUDA: the real ``LLM.sleep(level)`` / ``wake_up(tags)`` (``enable_sleep_mode``).
  On CPU vLLM refuses sleep mode, so both levels shut the engine down (its processes exit and
  their memory returns to the OS) and waking starts a new engine (≈ 20–50 s for a tiny model
  on 2 cores: process start, model load, KV cache allocation) with the latest weights: the
  checkpoint, then the state from the last state-dict update (kept on disk), then the
  active adapter.
- Cost of a state-dict update: the full state (checkpoint overlaid by every update) is written
  to ``work_dir/state`` and reloaded, so a partial update costs as much as a full one. On CPU
  most of it is vLLM's own reload: its layer-wise reload rebuilds every layer and repacks the
  linear weights for the CPU kernels (≈ 0.1 s for 85 MB). The previous state file is deleted
  in a background thread: dropping the page cache of a large file takes tens of ms.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
from vllm.lora.request import LoRARequest
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.outputs import RequestOutput
from vllm.sampling_params import RequestOutputKind

from grpo_runtime.errors import InvalidArgument
from grpo_runtime.model_classes import image_placeholder, load_processing
from grpo_runtime.tokenizing import decode_text
from rollout_service.engines.base import Engine, UpdatePause, derive_seed
from rollout_service.memory import release_freed_memory
from rollout_service.settings import RolloutSettings
from rollout_service.types import FinishReason, GenerationJob, RawCompletion, SamplingSpec
from rollout_service.weights import ValidatedUpdate

logger = logging.getLogger(__name__)

FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}


def load_state_dict_in_worker(worker, path: str) -> None:
    """Runs inside each vLLM worker: load a safetensors (partial) state dict in place.

    A tied LM head shares its weight with the input embeddings, so the reload writes the new
    values into it but leaves the head's layer unprocessed (no tensor of its own was loaded).
    On CPU that processing is what packs the weight for the logits GEMM (a copy), so the head
    would keep computing logits with the old embeddings: it is redone for every tied head.
    """
    tensors = load_file(path)
    worker.reload_weights(weights_iterator=iter(tensors.items()), is_checkpoint_format=True)
    model = worker.model_runner.get_model()
    modules = list(model.modules())
    embeddings = {
        id(m.weight)
        for m in modules
        if isinstance(m, VocabParallelEmbedding) and not isinstance(m, ParallelLMHead)
    }
    for module in modules:
        if isinstance(module, ParallelLMHead) and id(module.weight) in embeddings:
            module.quant_method.process_weights_after_loading(module)


class VllmEngine(Engine):
    name = "vllm"

    def __init__(self, model_dir: str, settings: RolloutSettings) -> None:
        self.model_dir = str(model_dir)
        self.settings = settings
        self.device = settings.resolved_device()
        self._cuda = self.device.startswith("cuda")
        # Read by vLLM when the engine starts: our own worker functions go through
        # collective_rpc as pickles; nothing may reach a model hub.
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        if not self._cuda:
            # A small KV cache, and no dynamo (it compiles the sampler with a C++ compiler).
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(settings.vllm.cpu_kvcache_space_gib))
            os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
        self.tokenizer, self.processor = load_processing(self.model_dir)
        # Sampled, the image token would stand for a picture that does not exist (HF engine: the same).
        self._image_token = image_placeholder(self.processor)[1] if self.processor is not None else None
        self._owns_work_dir = settings.work_dir is None
        self._work = Path(settings.work_dir or tempfile.mkdtemp(prefix="rollout-vllm-"))
        self._work.mkdir(parents=True, exist_ok=True)
        self._state_file = self._work / "state" / "current.safetensors"  # set by the first state dict
        self._state_file.parent.mkdir(parents=True, exist_ok=True)
        self._retired = itertools.count()  # names of replaced state files awaiting deletion
        self._deleters: list[threading.Thread] = []
        self._lora: LoRARequest | None = None
        self._base_discarded = False  # CUDA level-2 sleep: weights garbage until reloaded
        self._ids = itertools.count()
        self._llm: LLM | None = self._start()
        self.max_model_len = int(self._llm.llm_engine.model_config.max_model_len)

    # ---------------------------------------------------------------- startup
    def _start(self) -> LLM:
        s = self.settings
        kwargs: dict[str, Any] = {
            "model": self.model_dir,
            "dtype": s.resolved_dtype(),
            "enforce_eager": True,
            "enable_lora": True,
            "max_lora_rank": s.vllm.max_lora_rank,
            "max_loras": s.vllm.max_loras,
            "seed": s.seed,
            "logprobs_mode": "processed_logprobs",
            "max_num_seqs": s.max_batch_size,
            "enable_prefix_caching": s.vllm.enable_prefix_caching,
        }
        if s.max_model_len:
            kwargs["max_model_len"] = s.max_model_len
        if self.processor is not None:
            # vLLM sizes its encoder budget by the pictures a prompt may hold: the service's own limit.
            kwargs["limit_mm_per_prompt"] = {"image": s.images.max_images}
        if self._cuda:
            kwargs["gpu_memory_utilization"] = s.vllm.gpu_memory_utilization
            kwargs["enable_sleep_mode"] = s.vllm.enable_sleep_mode
        return LLM(**kwargs)

    @property
    def llm(self) -> LLM:
        if self._llm is None:
            raise RuntimeError("the vLLM engine is shut down by a sleep")
        return self._llm

    # --------------------------------------------------------------- generate
    def generate(self, jobs: list[GenerationJob], pause: UpdatePause | None = None) -> None:
        """One engine request per prompt (its ``n`` samples are vLLM's child requests).

        With ``pause``: :meth:`_generate_partial` (module docstring).

        Between steps, the requests of a job whose caller went away are aborted by their ids
        (``LLMEngine.abort_request`` also aborts the child requests of an ``n > 1`` parent), and
        whatever ends this call (an error included) aborts the requests still unfinished, so no
        work outlives the call.
        """
        if pause is not None:
            self._generate_partial(jobs, pause)
            return
        engine = self.llm.llm_engine
        owner: dict[str, tuple[GenerationJob, int]] = {}
        unfinished: set[str] = set()
        try:
            for job in jobs:
                job.results = [RawCompletion([], [], FinishReason.ABORT, "")] * job.num_rows
                if job.cancel.cancelled:
                    continue
                for i in range(len(job.prompt_token_ids)):
                    request_id = f"r{next(self._ids)}"
                    owner[request_id] = (job, i)
                    params = self._sampling_params(job, i)
                    engine.add_request(request_id, _engine_prompt(job, i), params, lora_request=self._lora)
                    unfinished.add(request_id)
            while unfinished:
                cancelled = {rid for rid in unfinished if owner[rid][0].cancel.cancelled}
                if cancelled:
                    engine.abort_request(sorted(cancelled))
                    unfinished -= cancelled
                # Checked after the aborts: step() blocks until the engine core has output, so it
                # must not be called once every request is gone.
                if not unfinished or not engine.has_unfinished_requests():
                    break
                for output in engine.step():
                    assert isinstance(output, RequestOutput)  # a generating model: no pooling output
                    if not output.finished or output.request_id not in owner:
                        continue
                    unfinished.discard(output.request_id)
                    job, i = owner[output.request_id]
                    _check_expansion(output, job, i)
                    for completion in sorted(output.outputs, key=lambda c: c.index):
                        job.results[i * job.n + completion.index] = _raw(completion)
        finally:
            if unfinished:
                engine.abort_request(sorted(unfinished))

    def _generate_partial(self, jobs: list[GenerationJob], pause: UpdatePause) -> None:
        """One n = 1 engine request per sequence; at a segment boundary with an update waiting, abort the
        unfinished ones, let the update apply, and continue each from its tokens so far."""
        engine = self.llm.llm_engine
        running: dict[str, _Sequence] = {}

        def submit(seq: _Sequence) -> None:
            request_id = f"r{next(self._ids)}"
            seq.kept = len(seq.tokens)
            seq.kept_text = (
                decode_text(self.tokenizer, seq.tokens, skip_special_tokens=True) if seq.tokens else ""
            )
            params = self._continuation_params(seq)
            prompt = _engine_prompt(seq.job, seq.prompt_index, seq.tokens)
            engine.add_request(request_id, prompt, params, lora_request=self._lora)
            running[request_id] = seq

        try:
            for job in jobs:
                job.results = [RawCompletion([], [], FinishReason.ABORT, "")] * job.num_rows
                if job.cancel.cancelled:
                    continue
                for i in range(len(job.prompt_token_ids)):
                    for j in range(job.n):
                        submit(_Sequence(job, i * job.n + j, _sample_seed(job, i, j)))
            steps = 0
            while running:
                cancelled = sorted(rid for rid, seq in running.items() if seq.job.cancel.cancelled)
                if cancelled:
                    engine.abort_request(cancelled)
                    for rid in cancelled:
                        del running[rid]
                if not running or not engine.has_unfinished_requests():
                    break
                for output in engine.step():
                    assert isinstance(output, RequestOutput)  # a generating model: no pooling output
                    seq = running.get(output.request_id)
                    if seq is None:
                        continue
                    seq.take(output.outputs[0], pause.version)
                    if output.finished:
                        _check_expansion(output, seq.job, seq.prompt_index)
                        del running[output.request_id]
                        seq.job.results[seq.index] = seq.result(output.outputs[0])
                steps += 1
                if running and steps % pause.segment_tokens == 0 and pause.requested:
                    engine.abort_request(sorted(running))
                    paused = list(running.values())
                    running.clear()
                    pause.pause()
                    for seq in paused:
                        submit(seq)
        finally:
            if running:
                engine.abort_request(sorted(running))

    def _continuation_params(self, seq: _Sequence) -> SamplingParams:
        """``seq``'s sampling for the rest of its tokens (a fresh seed per continuation point)."""
        s: SamplingSpec = seq.job.sampling
        done = len(seq.tokens)
        return SamplingParams(
            n=1,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            min_p=s.min_p,
            max_tokens=s.max_tokens - done,
            min_tokens=max(0, s.min_tokens - done),
            stop=list(s.stop) or None,
            seed=None if seq.seed is None else derive_seed(seq.seed, done),
            repetition_penalty=s.repetition_penalty,
            logit_bias=self._logit_bias,
            logprobs=0,
            skip_special_tokens=True,
            output_kind=RequestOutputKind.CUMULATIVE,
        )

    def _sampling_params(self, job: GenerationJob, prompt_index: int) -> SamplingParams:
        """vLLM derives the seeds of the n samples from ``seed`` (seed + index); each prompt gets
        its own derived seed so prompts of one request draw independent streams."""
        s: SamplingSpec = job.sampling
        return SamplingParams(
            n=job.n,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            min_p=s.min_p,
            max_tokens=s.max_tokens,
            min_tokens=s.min_tokens,
            stop=list(s.stop) or None,
            seed=None if s.seed is None else derive_seed(s.seed, prompt_index),
            repetition_penalty=s.repetition_penalty,
            logit_bias=self._logit_bias,
            logprobs=0,
            skip_special_tokens=True,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    @property
    def _logit_bias(self) -> dict[int, float] | None:
        """vLLM's lowest bias (it clamps to ±100) on the image token: e^-100 leaves it unsampled."""
        return None if self._image_token is None else {self._image_token: -100.0}

    def _reset_caches(self) -> None:
        """Forget what the old weights computed: the prefix cache's KV and, for a vision-language model, the
        encoder cache's image features (vLLM would reuse both for a prompt or picture it has seen)."""
        self.llm.reset_prefix_cache()
        if self.processor is not None:
            self.llm.llm_engine.reset_encoder_cache()

    # ---------------------------------------------------------------- weights
    def apply_update(self, update: ValidatedUpdate) -> None:
        if update.lora is not None:
            self._apply_lora(update)
            return
        # vLLM's layer-wise reload rebuilds each fused layer (qkv, gate_up) from the tensors it is
        # given, so a partial update of one projection would leave its siblings unset: always
        # reload the complete state, the checkpoint overlaid by every update so far.
        self._base_discarded = False  # a full reload follows
        state = self._current_state()
        for name, tensor in (update.state_dict or {}).items():
            state[name] = tensor.to(state[name].dtype) if name in state else tensor
        staged = self._state_file.with_suffix(".next")
        save_file({k: v.contiguous() for k, v in state.items()}, staged)
        del state  # the old file's pages may be mapped by it
        self._load_state_file(staged)
        self._retire_state_file()
        staged.replace(self._state_file)
        self._drop_lora()

    def _retire_state_file(self) -> None:
        """Move the current state file aside and delete it in a background thread."""
        if not self._state_file.exists():
            return
        retired = self._state_file.with_name(f"retired-{next(self._retired)}.safetensors")
        self._state_file.rename(retired)
        self._deleters = [t for t in self._deleters if t.is_alive()]
        deleter = threading.Thread(target=retired.unlink, kwargs={"missing_ok": True}, daemon=True)
        deleter.start()
        self._deleters.append(deleter)

    def _restore_base(self) -> None:
        if self._state_file.exists():
            self._load_state_file(self._state_file)
        else:
            self.llm.collective_rpc("reload_weights")  # the checkpoint from disk
            self._reset_caches()
        self._base_discarded = False

    def _current_state(self) -> dict[str, torch.Tensor]:
        if self._state_file.exists():
            return load_file(self._state_file)
        state: dict[str, torch.Tensor] = {}
        for file in sorted(Path(self.model_dir).glob("*.safetensors")):
            state.update(load_file(file))
        return state

    def _load_state_file(self, path: Path) -> None:
        self.llm.collective_rpc(load_state_dict_in_worker, args=(str(path),))
        self._reset_caches()

    def _apply_lora(self, update: ValidatedUpdate) -> None:
        assert update.lora is not None
        max_rank = self.settings.vllm.max_lora_rank
        if update.lora.rank > max_rank:
            raise InvalidArgument(
                f"the adapter has rank {update.lora.rank}, this engine takes at most vllm.max_lora_rank = "
                f"{max_rank}",
                field="data",
            )
        if self._base_discarded:
            # After a level-2 sleep on CUDA the base weights are garbage; an adapter alone would
            # serve on top of them, so restore the base first (the latest pushed state, never a
            # stale checkpoint over newer weights: the TRL #5312 trap).
            self._restore_base()
        directory = update.lora.write_dir(self._work / "lora" / f"v{update.version}")
        request = LoRARequest(
            lora_name=f"v{update.version}", lora_int_id=update.version, lora_path=str(directory)
        )
        try:
            self.llm.llm_engine.add_lora(request)  # loads it now: a failure leaves the old one serving
        except ValueError as exc:  # vLLM's word on an adapter it cannot serve (modules, config)
            shutil.rmtree(directory, ignore_errors=True)
            raise InvalidArgument(f"vLLM refused the adapter: {exc}", field="adapter_config_json") from exc
        self._drop_lora()
        self._lora = request
        self._reset_caches()

    def _drop_lora(self) -> None:
        if self._lora is not None:
            self.llm.llm_engine.remove_lora(self._lora.lora_int_id)
            shutil.rmtree(self._lora.lora_path, ignore_errors=True)
            self._lora = None

    # ------------------------------------------------------------------ sleep
    def sleep(self, level: int) -> None:
        if self._cuda and self.settings.vllm.enable_sleep_mode:
            self.llm.sleep(level=level)
            self._base_discarded = level == 2
            return
        self._shutdown()

    def wake_up(self, tags: set[str]) -> None:
        if self._cuda and self.settings.vllm.enable_sleep_mode:
            self.llm.wake_up(tags=sorted(tags))
            if "kv_cache" in tags:
                self._reset_caches()
            return
        if "weights" not in tags or self._llm is not None:
            return  # on CPU the KV cache comes back with the rebuilt engine
        self._llm = self._start()
        if self._state_file.exists():
            self._load_state_file(self._state_file)
        if self._lora is not None:
            self.llm.llm_engine.add_lora(self._lora)

    def _shutdown(self) -> None:
        if self._llm is not None:
            self._llm.llm_engine.engine_core.shutdown()
            self._llm = None
        release_freed_memory()

    def close(self) -> None:
        self._shutdown()
        for deleter in self._deleters:
            deleter.join()
        if self._owns_work_dir:
            shutil.rmtree(self._work, ignore_errors=True)


def _engine_prompt(job: GenerationJob, prompt_index: int, generated: list[int] | None = None) -> TokensPrompt:
    """vLLM's input for a prompt of ``job`` followed by ``generated`` tokens. A prompt with pictures goes with
    each picture still one placeholder: vLLM runs the model's processor on the pictures and expands the
    placeholders itself (it would expand already expanded ones again)."""
    images = job.images[prompt_index] if job.images else None
    if images is None:
        return TokensPrompt(prompt_token_ids=job.prompt_token_ids[prompt_index] + (generated or []))
    return TokensPrompt(
        prompt_token_ids=images.placeholder_ids + (generated or []),
        multi_modal_data={"image": list(images.pictures)},
    )


def _check_expansion(output: RequestOutput, job: GenerationJob, prompt_index: int) -> None:
    """vLLM's expanded prompt must be the ids the service reports (the validator's processor expanded them): a
    completion trained on other prompt ids than it was sampled from would be silently off-policy."""
    expected = job.prompt_token_ids[prompt_index]
    expanded = output.prompt_token_ids or []
    if job.images and job.images[prompt_index] and expanded[: len(expected)] != expected:
        raise RuntimeError(
            "vLLM expanded the image placeholders of a prompt differently from the model's processor "
            f"({len(expanded)} ids, the processor's {len(expected)})"
        )


def _sample_seed(job: GenerationJob, prompt_index: int, sample_index: int) -> int | None:
    seed = job.sampling.seed
    return None if seed is None else derive_seed(seed, prompt_index, sample_index)


@dataclass
class _Sequence:
    """One sequence of a partial-rollout batch: what its earlier requests produced (``kept`` tokens, whose
    text is ``kept_text``) and, after each step, its current request's cumulative output appended."""

    job: GenerationJob
    index: int  # in job.results
    seed: int | None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    kept: int = 0
    kept_text: str = ""

    @property
    def prompt_index(self) -> int:
        return self.index // self.job.n

    def take(self, completion, version: int) -> None:
        """The current request's cumulative output, sampled by ``version`` where it is new."""
        before = len(self.tokens)
        self.tokens = self.tokens[: self.kept] + list(completion.token_ids)
        self.logprobs = self.logprobs[: self.kept] + _raw(completion).logprobs
        self.versions = self.versions[:before] + [version] * (len(self.tokens) - before)

    def result(self, completion) -> RawCompletion:
        finish = FINISH.get(completion.finish_reason or "abort", FinishReason.ABORT)
        text = self.kept_text + completion.text
        return RawCompletion(self.tokens, self.logprobs, finish, text, self.versions)


def _raw(completion) -> RawCompletion:
    logprobs = [
        float(step[token].logprob)
        for token, step in zip(completion.token_ids, completion.logprobs or [], strict=False)
    ]
    return RawCompletion(
        token_ids=list(completion.token_ids),
        logprobs=logprobs,
        finish_reason=FINISH.get(completion.finish_reason or "abort", FinishReason.ABORT),
        text=completion.text,
    )
