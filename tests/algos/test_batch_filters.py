import pytest
import torch

from lmpo.algos import grpo, groups_with_signal, overlong_penalty, truncation_mask


def test_groups_with_signal():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.7, 0.7, 0.7])
    ids = torch.tensor([10, 10, 2, 2, 30, 30, -1, 5, 5, 5])
    keep = groups_with_signal(rewards, ids)
    assert keep.dtype == torch.bool
    assert keep.tolist() == [False, False, True, True, False, False, False, False, False, False]
    # exactly the sequences whose group advantage can be nonzero
    assert keep.tolist() == (grpo(rewards, ids) != 0).tolist()
    with pytest.raises(ValueError):
        groups_with_signal(rewards, ids.float())


def test_overlong_penalty_boundaries():
    # max_len 20, cache 4 -> expected length 16; linear from 0 at 16 to -1 at 20
    lengths = torch.tensor([0, 15, 16, 17, 18, 19, 20, 21, 100])
    out = overlong_penalty(lengths, max_len=20, cache_len=4)
    assert out.dtype == torch.get_default_dtype()
    torch.testing.assert_close(out, torch.tensor([0, 0, 0, -0.25, -0.5, -0.75, -1, -1, -1]))
    floats = overlong_penalty(torch.tensor([16.5, 20.0], dtype=torch.float64), 20, 4)
    torch.testing.assert_close(floats, torch.tensor([-0.125, -1.0], dtype=torch.float64))
    # cache_len == max_len: penalise from the first token
    torch.testing.assert_close(overlong_penalty(torch.tensor([0, 5, 10]), 10, 10),
                               torch.tensor([0.0, -0.5, -1.0]))


@pytest.mark.parametrize("cache_len", [0, -1, 21])
def test_overlong_penalty_errors(cache_len):
    with pytest.raises(ValueError, match="cache_len"):
        overlong_penalty(torch.tensor([1]), max_len=20, cache_len=cache_len)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool, torch.long])
def test_truncation_mask(dtype):
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 1, 0, 1]]).to(dtype)
    out = truncation_mask(mask, torch.tensor([False, True, False]))
    assert out.dtype == dtype
    assert out.long().tolist() == [[1, 1, 0, 0], [0, 0, 0, 0], [0, 1, 0, 1]]
    assert out.long().tolist() == truncation_mask(mask, torch.tensor([0, 1, 0])).long().tolist()
    with pytest.raises(ValueError):
        truncation_mask(mask, torch.tensor([True, False]))
