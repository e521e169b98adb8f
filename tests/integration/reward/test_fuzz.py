"""Property-based fuzzing of every reward RPC, and of the EnvironmentService the same process serves, against
a real server: any (bounded) message gets OK or a client-error status (never INTERNAL/UNKNOWN), OK answers
are well formed, and the server stays SERVING."""

from __future__ import annotations

import contextlib
import json
import math
import os

import grpc
import pytest
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpo.env.v1 import env_pb2, env_pb2_grpc
from grpo.reward.v1 import reward_pb2, reward_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_runtime.client import create_sync_channel

ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.FAILED_PRECONDITION,
}
NAMES = ["accuracy", "format", "tag_count", "reasoning_steps", "length", "cosine", "repetition_penalty",
         "soft_overlong", "json_schema", "prm:none", "orm:x", ""]  # fmt: skip
# Modest by default (the whole module runs in seconds); GRPO_FUZZ_EXAMPLES=500 for a long hunt.
FUZZ = settings(
    max_examples=int(os.environ.get("GRPO_FUZZ_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

floats = st.floats(allow_nan=True, allow_infinity=True)
scalars = st.none() | st.booleans() | floats | st.text(max_size=40)
json_trees = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
structs = st.dictionaries(
    st.sampled_from(["answer", "schema", "solution", "x"]) | st.text(max_size=8), json_trees, max_size=4
)
# Declared parameter names of the built-ins, so that values (not only unknown keys) get exercised.
PARAMS = ["style", "min_steps", "ngram_size", "max_penalty", "unit", "mode", "answer_key", "max_len", "clamp",
          "min_value_wrong", "max_value_wrong", "min_value_correct", "max_value_correct", "partial_credit",
          "max_completion_len", "soft_punish_cache"]  # fmt: skip
param_values = (
    json_trees
    | st.integers(-(2**63), 2**63)
    | st.sampled_from(["r1", "think", "words", "tokens", "chars", "numeric", "math_verify", "answer"])
)
texts = st.text(max_size=300) | st.sampled_from(
    ["<think>\nx\n</think>\n<answer>\n1\n</answer>", r"\boxed{2}", '{"a": 1}', "Step 1: a\nStep 2: b"]
)


def _struct(value: dict) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    # A shape protobuf's own helper refuses never reaches the wire.
    with contextlib.suppress(ValueError, TypeError):
        out.update(value)
    return out


@st.composite
def score_requests(draw) -> reward_pb2.ScoreRequest:
    request = reward_pb2.ScoreRequest()
    for _ in range(draw(st.integers(0, 10))):
        sample = request.samples.add(
            id=draw(st.text(max_size=10)),
            completion=draw(texts),
            completion_ids=draw(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=20)),
            group=draw(st.sampled_from(["", "g1", "g2"])),
        )
        sample.metadata.CopyFrom(_struct(draw(structs)))
        for _ in range(draw(st.integers(0, 2))):
            sample.prompt.add(
                role=draw(st.sampled_from(["", "user", "system"])), content=draw(st.text(max_size=30))
            )
    for _ in range(draw(st.integers(0, 4))):
        spec = request.rewards.add(name=draw(st.sampled_from(NAMES) | st.text(max_size=12)))
        if draw(st.booleans()):
            spec.weight = draw(floats)
        params = st.dictionaries(st.sampled_from(PARAMS) | st.text(max_size=12), param_values, max_size=3)
        spec.params.CopyFrom(_struct(draw(params)))
    return request


@pytest.fixture(scope="module")
def channel(reward_server):
    with create_sync_channel(reward_server.address) as channel:
        yield channel


def _check_scores(request: reward_pb2.ScoreRequest, reply: reward_pb2.ScoreResponse) -> None:
    assert [s.id for s in reply.scores] == [s.id for s in request.samples]
    for score in reply.scores:
        assert not score.HasField("reward") or math.isfinite(score.reward)
        assert [c.name for c in score.components] == [r.name for r in request.rewards]
        for c in score.components:
            assert not c.HasField("value") or math.isfinite(c.value)


def _serving(channel) -> None:
    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


@FUZZ
@given(request=score_requests())
def test_score(channel, request):
    stub = reward_pb2_grpc.RewardServiceStub(channel)
    try:
        reply = stub.Score(request, timeout=60)
    except grpc.RpcError as error:
        assert error.code() in ALLOWED, (error.code(), error.details())
    else:
        _check_scores(request, reply)
    _serving(channel)


@FUZZ
@given(requests=st.lists(score_requests(), max_size=3))
def test_score_stream(channel, requests):
    stub = reward_pb2_grpc.RewardServiceStub(channel)
    got = []
    try:
        for reply in stub.ScoreStream(iter(requests), timeout=60):
            got.append(reply)
    except grpc.RpcError as error:
        assert error.code() in ALLOWED, (error.code(), error.details())
    for request, reply in zip(requests, got, strict=False):
        _check_scores(request, reply)
    _serving(channel)


@FUZZ
@given(
    request=score_requests(),
    threshold=st.none() | floats,
    attacks=st.lists(st.sampled_from(["empty", "format_only", "gold_bare", "nope"]), max_size=3),
)
def test_stress_reward(channel, request, threshold, attacks):
    stress = reward_pb2.StressRewardRequest(samples=request.samples, rewards=request.rewards, attacks=attacks)
    if threshold is not None:
        stress.threshold = threshold
    stub = reward_pb2_grpc.RewardServiceStub(channel)
    try:
        reply = stub.StressReward(stress, timeout=120)
    except grpc.RpcError as error:
        assert error.code() in ALLOWED, (error.code(), error.details())
    else:
        assert math.isfinite(reply.threshold) and len(reply.baseline) == len(request.samples)
        for attack in reply.attacks:
            assert len(attack.scores) == len(request.samples)
            assert not attack.HasField("max_reward") or math.isfinite(attack.max_reward)
    _serving(channel)


def test_list_rewards(channel):
    reply = reward_pb2_grpc.RewardServiceStub(channel).ListRewards(
        reward_pb2.ListRewardsRequest(), timeout=10
    )
    assert reply.rewards


@FUZZ
@given(
    name=st.text(max_size=20),
    path=st.text(max_size=30).map(lambda p: f"fuzz-nonexistent/{p}"),
    kind=st.integers(-1, 5),
    fmt=st.integers(-1, 5),
    device=st.sampled_from(["", "cpu", "cuda:9", "meta"]) | st.text(max_size=6),
    dtype=st.sampled_from(["", "float32", "float8", "bogus"]),
)
def test_admin_rpcs(channel, name, path, kind, fmt, device, dtype):
    admin = reward_pb2_grpc.RewardAdminServiceStub(channel)
    calls = [
        lambda: admin.LoadModel(
            reward_pb2.LoadModelRequest(
                name=name, path=path, kind=kind, prm_format=fmt, device=device, dtype=dtype
            ),
            timeout=60,
        ),
        lambda: admin.UnloadModel(reward_pb2.UnloadModelRequest(name=name), timeout=10),
        lambda: admin.ListModels(reward_pb2.ListModelsRequest(), timeout=10),
    ]
    for call in calls:
        try:
            call()
        except grpc.RpcError as error:
            assert error.code() in ALLOWED, (error.code(), error.details())
    _serving(channel)


# --- grpo.env.v1.EnvironmentService: the same contract for the tool-episode RPCs -------------------------

ENVIRONMENTS = ["calculator", "python", "", "nope"]


def _json_text(value) -> str:
    try:
        return json.dumps(value, allow_nan=True)
    except (TypeError, ValueError):
        return "{}"


expressions = st.text(max_size=30) | st.sampled_from(["1 + 2", "2 ** 99", "1/0"])
programs = st.sampled_from(["print(1)", "1/0", "x = 2\nx", "while True: pass"])
nested = '{"expression": ' + "[" * 100 + "]" * 100 + "}"
odd_arguments = ["", "   ", "{", "[" * 3000, " " * 2000 + "{}", nested]
arguments = (
    json_trees.map(_json_text)
    | st.fixed_dictionaries({"expression": expressions}).map(_json_text)
    | st.fixed_dictionaries({"code": programs}).map(_json_text)
    | st.text(max_size=60)
    | st.sampled_from(odd_arguments)
)


tool_calls = st.builds(
    lambda name, args, call_id: env_pb2.ToolCall(name=name, arguments_json=args, id=call_id),
    st.sampled_from(["calculator", "python", "", "reset"]) | st.text(max_size=12),
    arguments,
    st.text(max_size=10),
)


@FUZZ
@given(
    environment=st.sampled_from(ENVIRONMENTS) | st.text(max_size=12),
    params=st.just({}) | structs,  # no shipped environment takes params: mostly none
    metadata=structs,
    calls=st.lists(tool_calls, max_size=6),
    use_opened=st.booleans(),
    other_id=st.text(max_size=40),
)
def test_environment_episode(channel, environment, params, metadata, calls, use_opened, other_id):
    """OpenEpisode → Step → GetReward → CloseEpisode with any (bounded) messages: OK or a client error,
    one result per call in order, a finite reward or none, and the server stays SERVING."""
    stub = env_pb2_grpc.EnvironmentServiceStub(channel)
    request = env_pb2.OpenEpisodeRequest(environment=environment)
    request.params.CopyFrom(_struct(params))
    request.metadata.CopyFrom(_struct(metadata))
    opened = None
    try:
        opened = stub.OpenEpisode(request, timeout=60).episode_id
    except grpc.RpcError as error:
        assert error.code() in ALLOWED, (error.code(), error.details())
    episode_id = opened if use_opened and opened is not None else other_id
    try:
        outcome = stub.Step(env_pb2.StepRequest(episode_id=episode_id, calls=calls), timeout=60)
    except grpc.RpcError as error:
        assert error.code() in ALLOWED, (error.code(), error.details())
    else:
        assert [(r.call_id, r.name) for r in outcome.results] == [(c.id, c.name) for c in calls]
    try:
        reward = stub.GetReward(env_pb2.GetRewardRequest(episode_id=episode_id), timeout=60)
    except grpc.RpcError as error:
        assert error.code() in ALLOWED, (error.code(), error.details())
    else:
        assert not reward.HasField("reward") or math.isfinite(reward.reward)
    if opened is not None:
        assert stub.CloseEpisode(env_pb2.CloseEpisodeRequest(episode_id=opened), timeout=60).closed
    _serving(channel)
