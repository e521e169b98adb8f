"""The one rule for groups in a TRL generation batch: runs of equal consecutive prompts."""

from grpo_runtime.prompt_groups import prompt_key, prompt_runs

A = [{"role": "user", "content": "1+1?"}]
B = [{"role": "user", "content": "2+2?"}]


def test_runs_of_equal_consecutive_prompts():
    assert prompt_runs([A, A, B, B]) == [(0, 2), (2, 2)]
    assert prompt_runs(["x", "y", "x"]) == [(0, 1), (1, 1), (2, 1)]  # equal but not adjacent: two groups
    assert prompt_runs([]) == []


def test_runs_split_at_the_group_size():
    assert prompt_runs([A] * 5, max_run=2) == [(0, 2), (2, 2), (4, 1)]
    assert prompt_runs([A] * 5) == [(0, 5)]


def test_key_ignores_mapping_order_and_tells_prompts_apart():
    assert prompt_key({"role": "user", "content": "a"}) == prompt_key({"content": "a", "role": "user"})
    assert prompt_key(A) != prompt_key(B)
    assert prompt_key(None) == prompt_key(None)
