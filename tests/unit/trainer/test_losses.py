"""The loss variants as pure tensor functions: each against its formula written out independently here."""

from __future__ import annotations

import math

import pytest
import torch

from tests.unit.trainer.fixtures import variant_loss
from trainer_service.training import losses
from trainer_service.training.losses import Aggregation, LossParams

B, T = 6, 7


@pytest.fixture
def batch() -> dict[str, torch.Tensor]:
    """Fixed random micro-batch: ℓ_θ with grad, ℓ_old off-policy by up to ±0.5 nats, ragged mask."""
    g = torch.Generator().manual_seed(1234)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 0.1
    logps = (old + (torch.rand(B, T, generator=g, dtype=torch.float64) - 0.5)).requires_grad_(True)
    mask = torch.ones(B, T, dtype=torch.float64)
    for i, length in enumerate([7, 3, 5, 1, 6, 4]):
        mask[i, length:] = 0
    advantages = torch.tensor([1.2, -0.7, 0.0, 0.4, -1.5, 0.9], dtype=torch.float64)
    return {"logps": logps, "old": old, "mask": mask, "adv": advantages}


def grad_of(loss: torch.Tensor, logps: torch.Tensor) -> torch.Tensor:
    (grad,) = torch.autograd.grad(loss, logps)
    return grad


def test_token_level_clipped_surrogate_matches_ppo_formula(batch):
    params = LossParams(epsilon_low=0.2, epsilon_high=0.28)
    out = losses.clipped_surrogate(batch["logps"], batch["old"], batch["adv"], batch["mask"], params)
    r = torch.exp(batch["logps"] - batch["old"])
    a = batch["adv"][:, None]
    expected = -torch.minimum(r * a, torch.clamp(r, 0.8, 1.28) * a)
    torch.testing.assert_close(out.per_token_loss, expected)
    torch.testing.assert_close(out.ratio, r)


def test_delta_caps_the_unclipped_branch_for_negative_advantages(batch):
    old = batch["old"].detach()
    logps = (old + 1.0).requires_grad_(True)  # r = e ≈ 2.72 everywhere
    params = LossParams(delta=1.5)
    out = losses.clipped_surrogate(logps, old, batch["adv"], batch["mask"], params)
    a = batch["adv"][:, None]
    expected = -torch.minimum(torch.full_like(a, 1.5) * a, torch.full_like(a, 1.2) * a).expand(B, T)
    torch.testing.assert_close(out.per_token_loss, expected)
    torch.testing.assert_close(out.ratio, torch.full_like(old, math.e))  # ratio reported before the cap


def test_sequence_level_ratio_is_geometric_mean_over_completion_tokens(batch):
    log_w = losses.importance_log_weights(batch["logps"], batch["old"], batch["mask"], "sequence")
    assert log_w.shape == (B, 1)
    for i in range(B):
        n = int(batch["mask"][i].sum())
        expected = (batch["logps"][i, :n] - batch["old"][i, :n]).mean()
        torch.testing.assert_close(log_w[i, 0], expected)
    with pytest.raises(ValueError, match="importance_sampling_level"):
        losses.importance_log_weights(batch["logps"], batch["old"], batch["mask"], "batch")


def test_cispo_gradient_is_clamped_weight_times_advantage(batch):
    params = LossParams(epsilon_high=1.1)
    out = losses.cispo(batch["logps"], batch["old"], batch["adv"], batch["mask"], params)
    loss = (out.per_token_loss * batch["mask"]).sum()
    r = torch.exp(batch["logps"] - batch["old"]).detach()
    expected_grad = -torch.clamp(r, max=1.1) * batch["adv"][:, None] * batch["mask"]
    torch.testing.assert_close(grad_of(loss, batch["logps"]), expected_grad)


def test_sapo_gate_has_unit_slope_on_policy(batch):
    logps = batch["old"].clone().requires_grad_(True)  # r = 1
    out = losses.sapo(logps, batch["old"], batch["adv"], batch["mask"], LossParams())
    loss = (out.per_token_loss * batch["mask"]).sum()
    # d/dr [σ(τ(r−1))·4/τ] at r = 1 is 1, so on-policy the gradient is the vanilla −A ∇ℓ_θ.
    torch.testing.assert_close(grad_of(loss, logps), -batch["adv"][:, None] * batch["mask"])


def test_vespo_weight_is_one_on_policy_and_gradient_is_weighted_reinforce(batch):
    logps = batch["old"].clone().requires_grad_(True)
    out = losses.vespo(logps, batch["old"], batch["adv"], batch["mask"], LossParams())
    torch.testing.assert_close(out.sequence_weights, torch.ones(B, 1, dtype=torch.float64))
    loss = (out.per_token_loss * batch["mask"]).sum()
    torch.testing.assert_close(grad_of(loss, logps), -batch["adv"][:, None] * batch["mask"])


def test_vespo_gamma_weight_formula_off_policy(batch):
    params = LossParams()
    phi = losses.vespo_gamma_weights(
        batch["adv"][:, None], batch["logps"] - batch["old"], batch["mask"], None, params
    )
    for i in range(B):
        log_w = float(((batch["logps"][i].detach() - batch["old"][i]) * batch["mask"][i]).sum())
        k, lam = (2.0, 3.0) if batch["adv"][i] >= 0 else (3.0, 2.0)
        expected = math.exp(lam + k * log_w - lam * math.exp(log_w))
        assert phi[i, 0].item() == pytest.approx(expected, rel=1e-9)
    assert not phi.requires_grad


def test_two_sided_is_symmetric_clip_with_global_token_mean(batch):
    delta = 0.3
    loss = variant_loss(
        "two_sided", batch["logps"], batch["old"], batch["adv"], batch["mask"], LossParams(delta=delta)
    )
    r = torch.exp(batch["logps"] - batch["old"])
    a = batch["adv"][:, None]
    per_token = -torch.minimum(r * a, torch.clamp(r, 1 - delta, 1 + delta) * a)
    expected = (per_token * batch["mask"]).sum() / batch["mask"].sum()
    torch.testing.assert_close(loss, expected)


@pytest.mark.parametrize("delta", [None, 0.0, 1.5])
def test_two_sided_rejects_delta_outside_unit_interval(batch, delta):
    with pytest.raises(ValueError, match="delta"):
        losses.two_sided(batch["logps"], batch["old"], batch["adv"], batch["mask"], LossParams(delta=delta))


def test_rft_is_nll_over_positive_advantage_tokens(batch):
    loss = variant_loss("rft", batch["logps"], batch["old"], batch["adv"], batch["mask"], LossParams())
    positive = (batch["adv"] > 0).double()[:, None] * batch["mask"]
    expected = -(batch["logps"] * positive).sum() / positive.sum()
    torch.testing.assert_close(loss, expected)
    grad = grad_of(loss, batch["logps"])
    assert torch.all(grad[batch["adv"] <= 0] == 0)
    assert torch.all(grad[positive.bool()] < 0)


def test_rft_without_positive_completions_gives_zero_loss_and_gradient(batch):
    adv = -batch["adv"].abs()
    loss = variant_loss("rft", batch["logps"], batch["old"], adv, batch["mask"], LossParams())
    assert loss.item() == 0.0
    assert torch.all(grad_of(loss, batch["logps"]) == 0)


def test_gpg_is_rescaled_policy_gradient(batch):
    params = LossParams(gpg_alpha=1.5)
    loss = variant_loss("gpg", batch["logps"], batch["old"], batch["adv"], batch["mask"], params)
    expected = -(1.5 * batch["adv"][:, None] * batch["logps"] * batch["mask"]).sum() / batch["mask"].sum()
    torch.testing.assert_close(loss, expected)


def test_gpg_rescaling_factor_is_groups_over_groups_with_spread():
    # B = 4 groups, M = 1 without spread: α = B / (B − M).
    assert losses.gpg_rescaling_factor(torch.tensor([False, True, False, False])) == pytest.approx(4 / 3)
    assert losses.gpg_rescaling_factor(torch.tensor([True, True])) == 1.0  # nothing to learn: no rescaling
    assert losses.gpg_rescaling_factor(torch.tensor([False, False])) == 1.0


def test_aggregations_match_their_formulas(batch):
    loss = torch.arange(B * T, dtype=torch.float64).reshape(B, T) / 10
    m = batch["mask"]
    lengths = m.sum(-1)
    torch.testing.assert_close(
        losses.aggregate(loss, m, Aggregation.SEQUENCE_MEAN), ((loss * m).sum(-1) / lengths).mean()
    )
    torch.testing.assert_close(losses.aggregate(loss, m, Aggregation.TOKEN_MEAN), (loss * m).sum() / m.sum())
    torch.testing.assert_close(
        losses.aggregate(loss, m, Aggregation.FIXED_LENGTH, max_completion_length=16),
        (loss * m).sum() / (B * 16),
    )
    torch.testing.assert_close(
        losses.aggregate(loss, m, Aggregation.GLOBAL_TOKEN, num_tokens=40.0), (loss * m).sum() / 40.0
    )
    torch.testing.assert_close(losses.aggregate(loss, m, Aggregation.SEQUENCE_SUM), (loss * m).sum(-1).mean())
    with pytest.raises(ValueError, match="max_completion_length"):
        losses.aggregate(loss, m, Aggregation.FIXED_LENGTH)
    with pytest.raises(ValueError, match="num_tokens"):
        losses.aggregate(loss, m, Aggregation.GLOBAL_TOKEN)


def test_sequence_level_losses_broadcast_over_tokens_in_aggregation(batch):
    params = LossParams(importance_sampling_level="sequence")
    out = losses.clipped_surrogate(batch["logps"], batch["old"], batch["adv"], batch["mask"], params)
    assert out.per_token_loss.shape == (B, 1)
    # luspo: mean over sequences of (sequence loss × |o_i|)
    expected = (out.per_token_loss[:, 0] * batch["mask"].sum(-1)).mean()
    torch.testing.assert_close(
        losses.aggregate(out.per_token_loss, batch["mask"], Aggregation.SEQUENCE_SUM), expected
    )


def test_k3_kl_is_zero_at_reference_and_positive_elsewhere(batch):
    kl = losses.k3_kl(batch["logps"], batch["old"])
    d = batch["old"] - batch["logps"]
    torch.testing.assert_close(kl, torch.exp(d) - d - 1)
    assert torch.all(kl >= 0)
    assert torch.all(losses.k3_kl(batch["old"], batch["old"]) == 0)


def test_off_policy_mask_drops_only_negative_advantage_drifted_sequences(batch):
    sampler = batch["logps"].detach().clone()
    sampler[1] += 1.0  # sequence 1 (A < 0) drifted by 1 nat per token
    sampler[0] += 1.0  # sequence 0 drifted too but has A > 0: kept
    keep = losses.off_policy_sequence_mask(
        batch["adv"], batch["logps"], sampler, batch["mask"], threshold=0.5
    )
    assert keep[:, 0].tolist() == [1.0, 0.0, 1.0, 1.0, 1.0, 1.0]


def test_every_variant_yields_a_finite_loss_with_gradient(batch):
    for name in losses.VARIANT_SPECS:
        params = LossParams(delta=0.2 if name == "two_sided" else None)
        loss = variant_loss(
            name, batch["logps"], batch["old"], batch["adv"], batch["mask"], params, max_completion_length=T
        )
        grad = grad_of(loss, batch["logps"])
        assert torch.isfinite(loss), name
        assert grad.abs().sum() > 0, name
        assert torch.all(grad[batch["mask"] == 0] == 0), f"{name}: padding must not get gradient"


def test_variants_give_different_gradients(batch):
    grads = {}
    for name in ("dapo", "cispo", "sapo", "vespo", "two_sided", "rft", "gpg"):
        params = LossParams(delta=0.05 if name == "two_sided" else None)
        loss = variant_loss(name, batch["logps"], batch["old"], batch["adv"], batch["mask"], params)
        grads[name] = grad_of(loss, batch["logps"])
    names = list(grads)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not torch.allclose(grads[a], grads[b]), (a, b)


@pytest.mark.parametrize("mode", losses.ROLLOUT_IS_MODES)
def test_rollout_importance_ratio_modes(batch, mode):
    old = batch["logps"].detach()
    sampler = old - 0.1  # the sampler is 0.1 nat less confident on every token
    sampler[0, 0] = float("nan")  # a token the engine could not score: ratio 1 there
    ratio = losses.rollout_importance_ratio(old, sampler, batch["mask"], mode, clip_min=0.5, clip_max=1.5)
    diff = torch.nan_to_num((old - sampler) * batch["mask"], nan=0.0)
    if mode.startswith("sequence"):
        raw = torch.exp(diff.sum(-1, keepdim=True))  # exp(0.1 × counted tokens): 1.82, 1.35, 1.65, 1.11, ...
        assert ratio.shape == (B, 1)
    else:
        raw = torch.exp(diff)
        assert ratio.shape == (B, T)
    if mode.endswith("truncate"):
        expected = raw.clamp(0.5, 1.5)
    else:
        expected = torch.where((raw < 0.5) | (raw > 1.5), torch.zeros_like(raw), raw)
    torch.testing.assert_close(ratio, expected)
    assert torch.isfinite(ratio).all()
    if mode == "sequence_mask":
        assert ratio[0, 0] == 0.0 and ratio[1, 0] > 0  # 6 counted tokens → e^0.6 > 1.5: masked; 3 → kept
    with pytest.raises(ValueError, match="rollout IS mode"):
        losses.rollout_importance_ratio(old, sampler, batch["mask"], "token", None, None)
