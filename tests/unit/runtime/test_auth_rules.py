"""Which RPCs are admin (read from the proto option) and how bearer tokens are parsed and compared."""

from __future__ import annotations

from grpo.reward.v1 import reward_pb2
from grpo.rollout.v1 import rollout_pb2
from grpo.trainer.v1 import trainer_pb2

from grpo_runtime.auth import admin_methods, bearer_metadata, bearer_token, token_matches


def test_admin_methods_come_from_the_proto_option():
    services = [
        rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"],
        trainer_pb2.DESCRIPTOR.services_by_name["TrainerService"],
    ]
    admin = admin_methods(services)
    assert "/grpo.rollout.v1.RolloutService/UpdateWeights" in admin
    assert "/grpo.rollout.v1.RolloutService/Sleep" in admin
    assert "/grpo.rollout.v1.RolloutService/Generate" not in admin
    assert "/grpo.rollout.v1.RolloutService/GetStatus" not in admin
    assert "/grpo.trainer.v1.TrainerService/StopRun" in admin
    assert "/grpo.trainer.v1.TrainerService/WatchRun" not in admin


def test_every_reward_admin_rpc_is_marked():
    admin_service = next(
        s for name, s in reward_pb2.DESCRIPTOR.services_by_name.items() if name.endswith("AdminService")
    )
    assert admin_methods([admin_service]) == {
        f"/{admin_service.full_name}/{method.name}" for method in admin_service.methods
    }


def test_bearer_token_parsing():
    assert bearer_token([("authorization", "Bearer abc")]) == "abc"
    assert bearer_token([("Authorization", b"bearer  abc ")]) == "abc"
    assert bearer_token([("x-other", "1"), bearer_metadata("t0k")]) == "t0k"
    assert bearer_token([("authorization", "Basic abc")]) is None
    assert bearer_token([("authorization", "Bearer ")]) is None
    assert bearer_token(None) is None


def test_token_comparison():
    assert token_matches("abc", "abc")
    assert not token_matches("abd", "abc")
    assert not token_matches("ab", "abc")
    assert not token_matches(None, "abc")
