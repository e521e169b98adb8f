"""A session's calls as training sequences, one per branch.

The calls form a tree: a call whose prompt extends an earlier call's prompt + choice k (``CallRecord.parent``,
see :mod:`conversation`) hangs below that (call, choice); every other call is a root. Every (call, choice)
that no later call extends is a leaf, and each leaf is one sequence: the leaf call's prompt ids + its
sampled ids — which by construction hold every ancestor's prompt and sampled ids at the same positions.
So a linear session (each call extends the one before, ``n`` = 1) is one sequence; ``n`` > 1, a call that
rewrites the history or a sub-agent's separate conversation adds branches.

``loss_mask`` is 1 exactly on the ids some call of the branch sampled, 0 on everything else (prompts, tool
results, messages the agent added, an end-of-turn token the template needed after a reply cut short).
Where the mask is 1, ``logprobs`` and ``policy_versions`` are the sampled token's; elsewhere the logprob is
0 and the version that of the call that fed the token to the engine first (the root's for its prompt).
"""

from __future__ import annotations

from rollout_service.gateway.sessions import CallRecord, Session
from rollout_service.gateway.types import AgentSequence, AgentTrajectory


def trajectory(session: Session) -> AgentTrajectory:
    calls = session.calls
    by_index = {call.index: call for call in calls}
    extended = {call.parent for call in calls if call.parent is not None}
    sequences = [
        _sequence(by_index, call, k)
        for call in calls
        for k in range(len(call.choices))
        if (call.index, k) not in extended
    ]
    return AgentTrajectory(sequences, len(calls), session.retokenized_tokens, session.prefix_mismatches)


def _sequence(by_index: dict[int, CallRecord], leaf: CallRecord, k: int) -> AgentSequence:
    """The branch ending in (``leaf``, choice ``k``), laid out root first."""
    path = [(leaf, k)]
    while path[-1][0].parent is not None:
        index, choice = path[-1][0].parent
        path.append((by_index[index], choice))
    path.reverse()
    token_ids = leaf.prompt_ids + leaf.choices[k].token_ids
    loss_mask = [0] * len(token_ids)
    logprobs = [0.0] * len(token_ids)
    versions = [0] * len(token_ids)
    fed_from = 0  # ids before this were fed by an earlier call of the path
    for call, choice_index in path:
        start = len(call.prompt_ids)
        versions[fed_from:start] = [call.policy_version] * (start - fed_from)
        sampled = call.choices[choice_index]
        end = start + len(sampled.token_ids)
        loss_mask[start:end] = [1] * len(sampled.token_ids)
        logprobs[start:end] = sampled.logprobs
        versions[start:end] = sampled.token_versions
        fed_from = end
    return AgentSequence(token_ids, loss_mask, logprobs, versions)
