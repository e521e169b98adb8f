"""An agent session's trajectory as one training completion: split at the first sampled token and held to
the run's token budget as the rollout service's own episodes are."""

from __future__ import annotations

import pytest

from rollout_service.client import AgentTrajectory, FinishReason
from rollout_service.gateway.types import AgentSequence
from trainer_service.rollout.agent_episodes import EpisodeFailed, agent_metrics, completion_of

# Two prompt tokens, a first reply of two tokens (version 2), a tool result of three, a second reply of two
# (version 3).
TOKENS = [1, 2, 10, 11, 20, 21, 22, 12, 13]
MASK = [0, 0, 1, 1, 0, 0, 0, 1, 1]
LOGPROBS = [0.0, 0.0, -0.1, -0.2, 0.0, 0.0, 0.0, -0.3, -0.4]
VERSIONS = [2, 2, 2, 2, 2, 2, 3, 3, 3]


def trajectory(*sequences: AgentSequence) -> AgentTrajectory:
    return AgentTrajectory(list(sequences), calls=2, retokenized_tokens=0, prefix_mismatches=0)


SESSION = trajectory(AgentSequence(TOKENS, MASK, LOGPROBS, VERSIONS))


@pytest.mark.parametrize("max_tokens", [None, 7, 100])
def test_a_completion_within_the_budget_is_the_whole_branch_after_the_first_sampled_token(max_tokens):
    completion = completion_of(SESSION, 1.0, max_tokens)
    assert completion.prompt_token_ids == [1, 2]
    assert completion.token_ids == TOKENS[2:] and completion.tool_mask == MASK[2:]
    assert completion.logprobs == LOGPROBS[2:] and completion.token_versions == VERSIONS[2:]
    assert completion.finish_reason == FinishReason.STOP
    assert completion.policy_version == 3 and completion.env_reward == 1.0


def test_a_longer_one_is_cut_back_to_its_last_sampled_token_and_finishes_with_length():
    # 4 tokens end inside the tool result: what follows the first reply would train nothing.
    completion = completion_of(SESSION, 0.0, 4)
    assert completion.token_ids == [10, 11] and completion.tool_mask == [1, 1]
    assert completion.logprobs == [-0.1, -0.2] and completion.token_versions == [2, 2]
    assert completion.finish_reason == FinishReason.LENGTH
    assert completion.policy_version == 2  # the second reply's version 3 is cut away
    assert completion.prompt_token_ids == [1, 2]


def test_a_cut_inside_a_reply_keeps_the_tokens_up_to_the_budget():
    completion = completion_of(SESSION, 0.0, 6)
    assert completion.token_ids == [10, 11, 20, 21, 22, 12]
    assert completion.tool_mask == [1, 1, 0, 0, 0, 1]
    assert completion.finish_reason == FinishReason.LENGTH and completion.policy_version == 3


def test_a_budget_of_one_token_keeps_the_first_sampled_one():
    completion = completion_of(SESSION, None, 1)
    assert completion.token_ids == [10] and completion.finish_reason == FinishReason.LENGTH


def test_the_last_branch_is_trained_the_others_counted_and_a_session_without_sampled_tokens_fails():
    first = AgentSequence([1, 5], [0, 1], [0.0, -1.0], [0, 0])
    branching = completion_of(trajectory(first, SESSION.sequences[0]), None)
    assert branching.token_ids == TOKENS[2:] and branching.untrained_branches == 1
    assert completion_of(SESSION, None).untrained_branches == 0
    metrics = agent_metrics([branching, completion_of(SESSION, None), branching])
    assert metrics["agents/untrained_branches"] == 2.0 and metrics["agents/episodes"] == 3.0
    with pytest.raises(EpisodeFailed, match="empty session"):
        completion_of(trajectory(), None)
    with pytest.raises(EpisodeFailed, match="no sampled token"):
        completion_of(trajectory(AgentSequence([1, 2], [0, 0], [0.0, 0.0], [0, 0])), None)
