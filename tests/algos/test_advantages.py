import math

import pytest
import torch

from lmpo.algos import (
    ADVANTAGES,
    dr_grpo,
    group_means,
    grpo,
    rloo,
    whiten_sequences,
    zero_variance_fraction,
    zero_variance_groups,
)

WORKED = [0.9, 0.6, 0.2, 0.0]
WORKED_DR = [0.475, 0.175, -0.225, -0.425]
WORKED_SAMPLE = [1.17833, 0.43412, -0.55816, -1.05430]
WORKED_POP = [1.36062, 0.50128, -0.64450, -1.21740]
WORKED_RLOO = [0.63333, 0.23333, -0.30000, -0.56667]


def reference(rewards, ids, kind, std="sample", scale="group", eps=1e-6):
    """Plain-Python float64 reference, one group at a time."""
    groups = {}
    for i, g in enumerate(ids):
        groups.setdefault(g, []).append(i)

    def sd(xs, sample):
        n = len(xs)
        m = sum(xs) / n
        d = (n - 1) if sample else n
        return math.sqrt(sum((x - m) ** 2 for x in xs) / d) if d > 0 else 0.0

    out = [0.0] * len(rewards)
    batch_sd = sd(rewards, std == "sample")
    for members in groups.values():
        xs = [rewards[i] for i in members]
        n, m = len(xs), sum(xs) / len(xs)
        for i in members:
            if kind == "dr_grpo" or (kind == "grpo" and scale == "none"):
                out[i] = rewards[i] - m
            elif kind == "rloo":
                out[i] = rewards[i] - (sum(xs) - rewards[i]) / (n - 1) if n > 1 else 0.0
            elif scale == "group":
                out[i] = (rewards[i] - m) / (sd(xs, std == "sample") + eps)
            else:
                out[i] = (rewards[i] - m) / (batch_sd + eps)
    return torch.tensor(out, dtype=torch.float64)


def _one_group(values):
    return torch.tensor(values), torch.zeros(len(values), dtype=torch.long)


@pytest.mark.parametrize(
    "fn, options, expected",
    [
        (grpo, {}, WORKED_SAMPLE),
        (grpo, {"std": "sample"}, WORKED_SAMPLE),
        (grpo, {"std": "population"}, WORKED_POP),
        (dr_grpo, {}, WORKED_DR),
        (rloo, {}, WORKED_RLOO),
        (grpo, {"scale": "none"}, WORKED_DR),
    ],
)
def test_worked_example(fn, options, expected):
    rewards, ids = _one_group(WORKED)
    torch.testing.assert_close(fn(rewards, ids, **options), torch.tensor(expected), atol=1e-4, rtol=0)


def test_worked_example_group_mean():
    rewards, ids = _one_group(WORKED)
    torch.testing.assert_close(group_means(rewards, ids), torch.full((4,), 0.425))


def test_two_interleaved_groups_with_noncontiguous_ids():
    # group 7 is the worked example; group -3 is [1, 0, 0]; ids interleaved and unsorted.
    rewards = torch.tensor([0.9, 1.0, 0.6, 0.0, 0.2, 0.0, 0.0])
    ids = torch.tensor([7, -3, 7, -3, 7, -3, 7])
    in_7 = ids == 7
    for fn, expected in ((grpo, WORKED_SAMPLE), (dr_grpo, WORKED_DR), (rloo, WORKED_RLOO)):
        out = fn(rewards, ids)
        torch.testing.assert_close(out[in_7], torch.tensor(expected), atol=1e-4, rtol=0)
        assert not torch.allclose(out[~in_7], torch.zeros(3))
    torch.testing.assert_close(rloo(rewards, ids)[~in_7], torch.tensor([1.0, -0.5, -0.5]))
    # sample std of [1, 0, 0] is sqrt(1/3)
    s = math.sqrt(1 / 3)
    expected = torch.tensor([2 / 3, -1 / 3, -1 / 3]) / (s + 1e-6)
    torch.testing.assert_close(grpo(rewards, ids)[~in_7], expected)


@pytest.mark.parametrize(
    "kind, std, scale",
    [("grpo", std, scale) for std in ("sample", "population") for scale in ("group", "batch", "none")]
    + [("dr_grpo", "sample", "group"), ("rloo", "sample", "group")],
)
def test_against_reference_random_groups(kind, std, scale):
    gen = torch.Generator().manual_seed(0)
    sizes = [1, 2, 3, 5, 8]
    group_ids = torch.cat([torch.full((n,), 1000 * k - 7) for k, n in enumerate(sizes)])
    group_ids = group_ids[torch.randperm(len(group_ids), generator=gen)]
    rewards = torch.rand(len(group_ids), generator=gen, dtype=torch.float64)
    options = {"std": std, "scale": scale} if kind == "grpo" else {}
    out = ADVANTAGES.get(kind)(rewards, group_ids, **options)
    expected = reference(rewards.tolist(), group_ids.tolist(), kind, std=std, scale=scale)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-10)


def test_batch_scaling_uses_the_batch_std():
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5, 0.25])
    ids = torch.tensor([0, 0, 1, 1, 1])
    out = grpo(rewards, ids, scale="batch")
    centered = torch.tensor([0.5, -0.5, 1 / 12, 1 / 12, -1 / 6])
    torch.testing.assert_close(out, centered / (rewards.std() + 1e-6))
    out_pop = grpo(rewards, ids, scale="batch", std="population")
    torch.testing.assert_close(out_pop, centered / (rewards.std(correction=0) + 1e-6))


def test_scale_none_is_dr_grpo():
    rewards = torch.tensor([3.0, 1.0, 2.0, 2.5])
    ids = torch.tensor([5, 5, 9, 9])
    torch.testing.assert_close(grpo(rewards, ids, scale="none"), torch.tensor([1.0, -1.0, -0.25, 0.25]))
    torch.testing.assert_close(dr_grpo(rewards, ids), torch.tensor([1.0, -1.0, -0.25, 0.25]))


@pytest.mark.parametrize(
    "fn, options",
    [(grpo, {}), (grpo, {"std": "population"}), (grpo, {"scale": "batch"}), (dr_grpo, {}), (rloo, {})],
)
def test_size_one_groups_get_zero(fn, options):
    rewards = torch.tensor([0.3, 1.0, 0.0, 0.8])
    ids = torch.tensor([4, 1, 1, 2])  # groups 4 and 2 have one member each
    out = fn(rewards, ids, **options)
    assert torch.isfinite(out).all()
    assert out[0] == 0 and out[3] == 0
    assert out[1] > 0 > out[2]


@pytest.mark.parametrize("value", [0.7, 0.1, 1.0, 0.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_all_equal_group_is_exactly_zero(value, dtype):
    # 0.7 * 3 leaves a ~1e-16 residual after mean subtraction; eps=0 would blow it up to +-1.
    rewards = torch.tensor([value, 1.0, value, 0.0, value], dtype=dtype)
    ids = torch.tensor([3, 8, 3, 8, 3])
    for out in (
        grpo(rewards, ids),
        grpo(rewards, ids, eps=0.0),
        grpo(rewards, ids, std="population", eps=0.0),
        grpo(rewards, ids, scale="batch"),
        dr_grpo(rewards, ids),
        rloo(rewards, ids),
    ):
        assert out.dtype == dtype
        assert (out[ids == 3] == 0).all()
        assert (out[ids == 8] != 0).all()


def test_zero_variance_groups_and_fraction():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5])
    ids = torch.tensor([10, 10, 2, 2, 30, 30, -1])
    # sorted ids: -1 (size 1, trivially equal), 2 (mixed), 10 (all 1), 30 (all 0)
    assert zero_variance_groups(rewards, ids).tolist() == [True, False, True, True]
    assert zero_variance_fraction(rewards, ids) == pytest.approx(0.75)
    assert zero_variance_fraction(torch.tensor([0.0, 1.0]), torch.tensor([0, 0])) == 0.0
    assert isinstance(zero_variance_fraction(rewards, ids), float)


def test_invalid_options_and_shapes():
    rewards, ids = _one_group(WORKED)
    with pytest.raises(ValueError, match="std"):
        grpo(rewards, ids, std="bessel")
    with pytest.raises(ValueError, match="scale"):
        grpo(rewards, ids, scale="global")
    with pytest.raises(ValueError):
        grpo(rewards, ids[:3])
    with pytest.raises(ValueError):
        grpo(rewards, ids.float())
    with pytest.raises(ValueError, match="choose one of: dr_grpo, grpo, rloo"):
        ADVANTAGES.get("foo")


def test_empty_batch():
    empty, ids = torch.zeros(0), torch.zeros(0, dtype=torch.long)
    assert grpo(empty, ids).shape == (0,)
    assert grpo(empty, ids, scale="batch").shape == (0,)
    assert zero_variance_fraction(empty, ids) == 0.0


def test_whiten_sequences_hand_values():
    # the worked example's dr_grpo advantages: mean 0, population std 0.34911, sample std 0.40311
    adv = torch.tensor(WORKED_DR, dtype=torch.float64)
    out = whiten_sequences(adv, eps=0.0)
    torch.testing.assert_close(out, torch.tensor(WORKED_POP, dtype=torch.float64), atol=1e-5, rtol=0)
    out = whiten_sequences(adv, eps=0.0, unbiased=True)
    torch.testing.assert_close(out, torch.tensor(WORKED_SAMPLE, dtype=torch.float64), atol=1e-5, rtol=0)
    # TRL's RLOO: (A - mean) / (std + 1e-4); 0.475 / (0.403113 + 0.0001) = 1.178038
    out = whiten_sequences(adv, eps=1e-4, unbiased=True)
    assert out[0].item() == pytest.approx(0.475 / (math.sqrt(0.4875 / 3) + 1e-4), abs=1e-12)
    assert out[0].item() == pytest.approx(1.178038, abs=1e-6)


def test_whiten_sequences_reference_and_valid():
    gen = torch.Generator().manual_seed(0)
    adv = torch.randn(9, generator=gen, dtype=torch.float64) * 3 + 1
    valid = torch.tensor([True] * 6 + [False] * 3)
    out = whiten_sequences(adv, valid, eps=1e-4, unbiased=True)
    kept = adv[:6].tolist()
    mean = sum(kept) / 6
    std = math.sqrt(sum((a - mean) ** 2 for a in kept) / 5)
    expected = [(a - mean) / (std + 1e-4) for a in kept] + [0.0] * 3
    torch.testing.assert_close(out, torch.tensor(expected, dtype=torch.float64), atol=1e-12, rtol=1e-12)
    # a float32 input comes back float32; empty or constant batches give zeros, not NaN
    assert whiten_sequences(adv.float()).dtype == torch.float32
    assert whiten_sequences(adv, torch.zeros(9, dtype=torch.bool)).abs().sum() == 0
    assert whiten_sequences(torch.ones(4), eps=0.0).abs().sum() == 0
    with pytest.raises(ValueError, match="1-D"):
        whiten_sequences(adv[None])


@pytest.mark.parametrize("dtype", [torch.long, torch.int32, torch.bool])
@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_integer_and_bool_rewards_give_float_advantages(name, dtype):
    """0/1 correctness as an integer tensor: grpo gave [1, 0, 0, 0, 0, 0, -1, 0] (truncated toward 0),
    dr_grpo all zeros, and bool rewards bool advantages."""
    from lmpo.algos import advantages_of_valid

    fn = ADVANTAGES.get(name)
    rewards, ids = torch.tensor([1, 0, 0, 0, 1, 1, 0, 1]), torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    expected = fn(rewards.float(), ids)
    out = fn(rewards.to(dtype), ids)
    assert out.dtype == torch.get_default_dtype() and torch.equal(out, expected)
    valid = torch.tensor([True] * 7 + [False])
    masked = advantages_of_valid(fn, rewards.to(dtype), ids, valid)
    assert masked.dtype == torch.get_default_dtype()
    assert torch.equal(masked, advantages_of_valid(fn, rewards.float(), ids, valid))
    assert torch.equal(group_means(rewards.to(dtype), ids), torch.tensor([0.25] * 4 + [0.75] * 4))
    assert whiten_sequences(rewards.to(dtype)).dtype == torch.get_default_dtype()
    assert fn(rewards.double(), ids).dtype == torch.float64  # floating dtypes are kept


def test_grpo_refuses_negative_eps():
    # eps=-1 used to run, dividing by (std - 1): near-zero or negative denominators
    with pytest.raises(ValueError, match=r"eps must be >= 0, got -1"):
        grpo(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), eps=-1)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_sequences_instead_of_tensors_are_a_clear_type_error(name):
    # Python lists used to fail deep inside with "AttributeError: 'list' object has no attribute 'dim'"
    with pytest.raises(TypeError, match=r"rewards must be a torch.Tensor, got list"):
        ADVANTAGES.get(name)([1.0, 0.0], torch.tensor([0, 0]))
    with pytest.raises(TypeError, match=r"group_ids must be a torch.Tensor, got list"):
        ADVANTAGES.get(name)(torch.tensor([1.0, 0.0]), [0, 0])
