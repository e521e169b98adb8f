"""Generative judges (``judge:<name>``): a causal LM asked a yes/no question about each completion.

The question is a template (``reward_service.judges.template``) filled with the sample, sent as one user
turn through the tokenizer's chat template with the generation prompt (the judge's answer starts right
after it; without a chat template the filled text is tokenized as is). With ``a``/``b`` the ids of the
verdict tokens (``Yes``/``No`` by default) and ``z`` the logits of the judge's first answer token::

    value = p(Yes) / (p(Yes) + p(No)) = softmax(z[[a, b]])[0]        in [0, 1]

(``reward_service.models.verdict``) — the verdict's probability, not a sampled answer, so equal inputs
give equal rewards and the score is smooth in the judge's confidence.

Modes (param ``mode``):

* ``pointwise``: each completion judged alone with ``judge_template``. The completions of one prompt
  share the template's text up to ``{completion}``; the batcher computes that prefix once (KV reuse).
* ``group`` (RULER-style, OpenPipe ART): the judge sees every completion of the prompt (``Sample.group``;
  no group: the whole request) in one list, then is asked about each in turn with ``judge_group_template``;
  G sequences share the whole list as their prefix, so the list is computed once and each verdict costs
  only the few tokens of its question. Scores are relative to the group by construction.

A completion longer than the judge's context (``max_position_embeddings``, ``models.max_sequence_tokens``)
is cut in the middle, keeping its head and tail, with a marker in its place that says how many tokens
were cut, so the judge (and anyone reading its prompt) sees the truncation; in group mode each
completion gets an equal share of the context. A template field missing from the sample's metadata is
that sample's component error naming the field.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from grpo_runtime.errors import InvalidArgument
from grpo_runtime.tokenizing import decode_text
from reward_service.core.types import ComponentResult, ParamInfo, RewardDescription, Sample
from reward_service.judges.template import (
    TRUNCATION_MARKER,
    TemplateError,
    cut_middle,
    judge_templates,
    numbered,
    prompt_text,
)
from reward_service.models.engine import Encoded, SampleError
from reward_service.models.loading import LoadedModel
from reward_service.models.verdict import TokenPairEngine
from reward_service.rewards.accuracy import group_indices

MODES = ("pointwise", "group")
# Fewest tokens of its own a completion keeps when cut (beside the marker); below, the sample is refused.
MIN_COMPLETION_TOKENS = 8


class JudgeModel(TokenPairEngine):
    """``judge:<name>``: one verdict probability per sample (see the module docstring)."""

    params = (
        ParamInfo(
            name="mode",
            type="string",
            default="pointwise",
            description="pointwise: each completion judged alone; group: every completion of the prompt "
            "shown together, each judged against the others (RULER-style).",
            choices=MODES,
        ),
    )

    def __init__(self, loaded: LoadedModel, **kwargs: Any) -> None:
        super().__init__(loaded, **kwargs)
        self.pointwise, self.group = judge_templates(
            loaded.spec.judge_template, loaded.spec.judge_group_template
        )
        tokenizer = loaded.tokenizer
        self._chat = getattr(tokenizer, "chat_template", None) is not None

    def validate_params(self, params: dict[str, Any]) -> dict[str, Any]:
        resolved = super().validate_params(params)
        if resolved["mode"] not in MODES:
            raise InvalidArgument(
                f"{resolved['mode']!r} is not one of {', '.join(MODES)}", field="params.mode"
            )
        return resolved

    def _ids(self, text: str) -> list[int]:
        """Ids of the judge's input for the filled template ``text`` (caller holds the tokenizer lock)."""
        return self._ids_batch([text])[0]

    def _ids_batch(self, texts: list[str]) -> list[list[int]]:
        """``_ids`` of each text, tokenized in one call (a fast tokenizer encodes a batch in parallel)."""
        tokenizer = self.loaded.tokenizer
        if self._chat:
            chats = [
                tokenizer.apply_chat_template(
                    [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
                )
                for text in texts
            ]
            return tokenizer(chats, add_special_tokens=False)["input_ids"]
        return tokenizer(texts)["input_ids"]

    def _cut(self, text: str, keep: int) -> str:
        """``text`` with its middle replaced by the truncation marker so that about ``keep`` of its tokens
        remain (head and tail halves); unchanged when it has no more."""
        tokenizer = self.loaded.tokenizer
        cut = cut_middle(tokenizer(text, add_special_tokens=False)["input_ids"], keep, "tokens")
        if cut is None:
            return text
        head, tail, marker = cut
        return decode_text(tokenizer, head) + marker + decode_text(tokenizer, tail)

    def _fit(self, render: Callable[[list[str]], str], texts: list[str]) -> tuple[list[str], list[int]]:
        """``texts``, cut (each to an equal share of tokens) as far as needed for ``render(texts)`` to fit
        the context, and the ids of ``render`` of them.

        The share starts at what the fixed part leaves and shrinks by the overshoot each round (a cut
        re-tokenizes a little differently at its edges); SampleError when even the minimum share does not fit.
        """
        limit = self.loaded.max_positions
        ids = self._ids(render(texts))
        if len(ids) <= limit:
            return texts, ids
        fixed = len(self._ids(render([""] * len(texts))))
        marker = TRUNCATION_MARKER.format(cut=0, total=0, unit="tokens")
        share = (limit - fixed) // len(texts) - len(self.loaded.tokenizer(marker)["input_ids"]) - 4
        for _ in range(4):
            if share < MIN_COMPLETION_TOKENS:
                break
            cut = [self._cut(text, share) for text in texts]
            ids = self._ids(render(cut))
            if len(ids) <= limit:
                return cut, ids
            share -= (len(ids) - limit) // len(texts) + 1
        raise SampleError(
            f"the judge's template and prompt leave too little of its {limit}-token context for "
            f"{len(texts)} completion(s) ({MIN_COMPLETION_TOKENS} tokens each at least)"
        )

    def _encode(self, sample: Sample) -> Encoded:
        """Pointwise: the template filled with the sample; read out at the last token."""
        try:
            values = {"prompt": prompt_text(sample), **self.pointwise.metadata(sample)}
        except TemplateError as exc:
            raise SampleError(str(exc)) from exc
        _, ids = self._fit(
            lambda texts: self.pointwise.fill({**values, "completion": texts[0]}), [sample.completion]
        )
        return Encoded(input_ids=ids, positions=[len(ids) - 1])

    def encode_samples(self, samples: Sequence[Sample], params: dict[str, Any]) -> list[Encoded | str]:
        if params.get("mode") != "group":
            return self._encode_pointwise(samples)
        encoded: list[Encoded | str] = [""] * len(samples)
        for members in group_indices(samples):
            for index, item in zip(members, self._encode_group([samples[i] for i in members]), strict=True):
                encoded[index] = item
        return encoded

    def _fill_pointwise(self, fields: dict[str, str], completions: list[str]) -> str:
        """The pointwise template filled with ``fields`` and ``completions[0]`` as the completion."""
        return self.pointwise.fill({**fields, "completion": completions[0]})

    def _encode_pointwise(self, samples: Sequence[Sample]) -> list[Encoded | str]:
        """``_encode`` of every sample, the filled templates tokenized in one batch; a sample over the
        context is then cut on its own (``_fit``)."""
        encoded: list[Encoded | str] = []
        values: dict[int, dict[str, str]] = {}
        for index, sample in enumerate(samples):
            try:
                values[index] = {"prompt": prompt_text(sample), **self.pointwise.metadata(sample)}
                encoded.append("")
            except TemplateError as exc:
                encoded.append(str(exc))
        texts = [self.pointwise.fill({**values[i], "completion": samples[i].completion}) for i in values]
        with self._tokenizer_lock:
            for index, ids in zip(values, self._ids_batch(texts) if texts else [], strict=True):
                if len(ids) > self.loaded.max_positions:
                    try:
                        _, ids = self._fit(
                            functools.partial(self._fill_pointwise, values[index]),
                            [samples[index].completion],
                        )
                    except SampleError as exc:
                        encoded[index] = str(exc)
                        continue
                encoded[index] = Encoded(input_ids=ids, positions=[len(ids) - 1])
        return encoded

    def _encode_group(self, samples: list[Sample]) -> list[Encoded | str]:
        """One sequence per completion of the group: the whole list, then the question about that one.
        The prompt and metadata are the group's first sample's (a group is one prompt)."""
        first = samples[0]
        try:
            values = {"prompt": prompt_text(first), **self.group.metadata(first)}
        except TemplateError as exc:
            return [str(exc)] * len(samples)

        def render(texts: list[str], k: int = len(samples)) -> str:
            return self.group.fill({**values, "completions": numbered(texts), "index": str(k)})

        with self._tokenizer_lock:
            # Cut once, for the longest question (most digits in {index}): every question then fits.
            try:
                listing, _ = self._fit(render, [s.completion for s in samples])
            except SampleError as exc:
                return [str(exc)] * len(samples)
            out: list[Encoded | str] = []
            for k in range(1, len(samples) + 1):
                ids = self._ids(render(listing, k))
                if len(ids) > self.loaded.max_positions:  # a tokenizer that merges differently at k
                    out.append(f"the question about [{k}] is {len(ids)} tokens, over the judge's context")
                    continue
                out.append(Encoded(input_ids=ids, positions=[len(ids) - 1]))
        return out

    def check_fast_paths(self, probe: list[Sample], tolerance: float) -> dict[str, bool]:
        """As for every engine, with the template's metadata fields filled in the probe samples."""
        filled = {name: "15" for name in self.pointwise.metadata_fields}
        return super().check_fast_paths(
            [replace(s, metadata={**s.metadata, **filled}) for s in probe], tolerance
        )

    def finish(self, output: list[float], params: dict[str, Any]) -> ComponentResult:
        return ComponentResult(value=float(output[0]))

    def describe(self, reward_name: str) -> RewardDescription:
        loaded = self.loaded
        tokenizer = loaded.tokenizer
        yes, no = (tokenizer.convert_ids_to_tokens(i) for i in loaded.token_pair())
        return RewardDescription(
            name=reward_name,
            description=f"Generative judge from {loaded.spec.path}: value = p({yes}) / (p({yes}) + p({no})) "
            "for the judge's first answer token after its template filled with the sample (pointwise) or "
            "with every completion of the group (mode=group, RULER-style). Completions longer than the "
            f"judge's {loaded.max_positions}-token context are cut in the middle, with a marker saying so.",
            params=self.params,
            required_metadata=self.pointwise.metadata_fields,
            min_value=0.0,
            max_value=1.0,
            group_aware=True,
        )
