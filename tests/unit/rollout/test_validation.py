"""Request validation: every bad input is INVALID_ARGUMENT naming its field."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from grpo_runtime.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from rollout_service.core.validation import RequestValidator, check_completions
from rollout_service.types import (
    FinishReason,
    GenerateRequest,
    PromptInput,
    RawCompletion,
    SamplingSpec,
)


@pytest.fixture(scope="module")
def validator(tiny_models) -> RequestValidator:
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["policy"])
    return RequestValidator(
        tokenizer,
        max_model_len=64,
        vocab_size=len(tokenizer),
        max_prompts=4,
        max_request_tokens=300,
        max_request_sequences=20,
    )


def request(*prompts: PromptInput, n: int = 1, **sampling) -> GenerateRequest:
    return GenerateRequest(prompts=prompts, n=n, sampling=SamplingSpec(**sampling))


TEXT = PromptInput(id="a", text="What is 12 + 7?")


@pytest.mark.parametrize(
    ("req", "field"),
    [
        (request(), "prompts"),
        (request(TEXT, n=0), "n"),
        (request(TEXT, PromptInput(id="b")), "prompts[1]"),
        (request(PromptInput(text="x", token_ids=(1, 2))), "prompts[0]"),
        (request(PromptInput(messages=(("user", "hi"),), text="x")), "prompts[0]"),
        (request(PromptInput(messages=(("", "hi"),))), "prompts[0].messages[0].role"),
        (request(PromptInput(token_ids=(1, 99999))), "prompts[0].token_ids[1]"),
        (request(PromptInput(token_ids=(1,) * 64)), "prompts[0]"),  # no room left in the context
        (request(PromptInput(text="x" * (64 * 32 + 1))), "prompts[0]"),  # refused untokenized
        (request(PromptInput(messages=(("user", "x" * 64 * 32),))), "prompts[0]"),
        (request(TEXT, max_tokens=0), "sampling.max_tokens"),
        (request(TEXT, max_tokens=60), "sampling.max_tokens"),
        (request(TEXT, temperature=-0.1), "sampling.temperature"),
        (request(TEXT, temperature=float("nan")), "sampling.temperature"),
        (request(TEXT, temperature=float("inf")), "sampling.temperature"),
        (request(TEXT, temperature=1e-30), "sampling.temperature"),  # logits / T overflows fp32
        (request(TEXT, temperature=1e-45), "sampling.temperature"),  # a float32 denormal
        (request(TEXT, temperature=0.009), "sampling.temperature"),
        (request(TEXT, temperature=1e30), "sampling.temperature"),
        (request(TEXT, top_p=float("nan")), "sampling.top_p"),
        (request(TEXT, min_p=float("nan")), "sampling.min_p"),
        (request(TEXT, min_p=-0.5), "sampling.min_p"),
        (request(TEXT, repetition_penalty=float("nan")), "sampling.repetition_penalty"),
        (request(TEXT, repetition_penalty=1e-30), "sampling.repetition_penalty"),
        (request(TEXT, repetition_penalty=1e30), "sampling.repetition_penalty"),
        (request(TEXT, stop=("x",) * 17), "sampling.stop"),
        (request(TEXT, stop=("x" * 257,)), "sampling.stop[0]"),
        (request(TEXT, top_p=0.0), "sampling.top_p"),
        (request(TEXT, top_p=1.5), "sampling.top_p"),
        (request(TEXT, top_k=-2), "sampling.top_k"),
        (request(TEXT, min_p=1.5), "sampling.min_p"),
        (request(TEXT, repetition_penalty=0.0), "sampling.repetition_penalty"),
        (request(TEXT, min_tokens=20, max_tokens=10), "sampling.min_tokens"),
        (request(TEXT, stop=("ok", "")), "sampling.stop[1]"),
    ],
)
def test_bad_requests_name_the_field(validator, req, field):
    with pytest.raises(InvalidArgument) as info:
        validator.to_job(req)
    assert info.value.field == field


def test_three_prompt_forms_tokenize(validator):
    chat = PromptInput(id="c", messages=(("user", "What is 2 + 2?"),))
    ids = PromptInput(id="i", token_ids=(5, 6, 7))
    job = validator.to_job(request(TEXT, chat, ids, n=3, top_k=-1))
    tok = validator.tokenizer
    assert job.prompt_token_ids[0] == tok("What is 12 + 7?")["input_ids"]
    expected_chat = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 2?"}], add_generation_prompt=True, tokenize=False
    )
    assert tok.decode(job.prompt_token_ids[1]) == expected_chat
    assert expected_chat.endswith("<|im_start|>assistant\n")
    assert job.prompt_token_ids[2] == [5, 6, 7]
    assert job.num_rows == 9
    assert job.sampling.top_k == 0  # -1 normalised to "off"


@pytest.mark.parametrize("temperature", [0.0, 0.01, 1.0, 100.0])
def test_temperature_bounds_accept_greedy_and_the_safe_range(validator, temperature):
    assert validator.to_job(request(TEXT, temperature=temperature)).sampling.temperature == temperature


@pytest.mark.parametrize(
    ("req", "field", "limit"),
    [
        (request(*[TEXT] * 5), "prompts", "max_prompts"),
        (request(TEXT, TEXT, n=9, max_tokens=17), "sampling.max_tokens", "max_request_tokens"),
        (request(TEXT, TEXT, TEXT, n=7, max_tokens=1), "n", "max_request_sequences"),
        (request(PromptInput(token_ids=(5,) * 40), n=8, max_tokens=1), "prompts", "max_request_tokens"),
    ],
)
def test_server_limits_are_resource_exhausted_naming_the_limit(validator, req, field, limit):
    with pytest.raises(ResourceExhausted) as info:
        validator.to_job(req)
    assert info.value.field == field and limit in info.value.details


def test_a_chat_template_that_refuses_the_messages_is_invalid_argument(validator, tiny_models):
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["policy"])
    tokenizer.chat_template = "{{ raise_exception('roles must alternate') }}"
    strict = RequestValidator(tokenizer, max_model_len=64, vocab_size=len(tokenizer))
    with pytest.raises(InvalidArgument) as info:
        strict.to_job(request(PromptInput(messages=(("user", "hi"),))))
    assert info.value.field == "prompts[0].messages" and "roles must alternate" in info.value.message
    tokenizer.chat_template = None
    with pytest.raises(InvalidArgument, match="no chat template") as info:
        strict.to_job(request(PromptInput(messages=(("user", "hi"),))))
    assert info.value.field == "prompts[0].messages"


def test_a_top_k_past_the_vocabulary_is_off(validator):
    assert validator.to_job(request(TEXT, top_k=2**31 - 1)).sampling.top_k == 0
    assert validator.to_job(request(TEXT, top_k=5)).sampling.top_k == 5


def test_completions_with_non_finite_logprobs_or_foreign_tokens_never_pass():
    good = RawCompletion([1, 2], [-0.5, -1.0], FinishReason.LENGTH)
    check_completions([good], vocab_size=10, n=1)
    for bad in (
        RawCompletion([1, 2], [-0.5, float("nan")], FinishReason.LENGTH),
        RawCompletion([1], [float("-inf")], FinishReason.LENGTH),
        RawCompletion([1, 10], [-0.5, -1.0], FinishReason.LENGTH),
        RawCompletion([1, 2], [-0.5], FinishReason.LENGTH),
    ):
        with pytest.raises(FailedPrecondition, match=r"prompts\[0\] sample 1"):
            check_completions([good, bad], vocab_size=10, n=2)
