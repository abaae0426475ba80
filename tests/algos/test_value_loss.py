import pytest
import torch

from lmpo.algos import AGGREGATIONS, clipped_value_loss

NAN = float("nan")


def _t(rows, grad=False):
    return torch.tensor(rows, dtype=torch.float64, requires_grad=grad)


# Hand-worked, eps_v = 0.2, V_old = 0.6 everywhere -> clip range [0.4, 0.8]:
# t0: V=1.0, G=0.0: (V-G)^2 = 1.00, (0.8-G)^2 = 0.64 -> 0.5*1.00 = 0.5,   unclipped, dl/dV = V-G = 1.0
# t1: V=0.5, G=1.0: (V-G)^2 = 0.25, clip(V)=V       -> 0.5*0.25 = 0.125, unclipped, dl/dV = -0.5
# t2: V=1.0, G=1.2: (V-G)^2 = 0.04, (0.8-G)^2 = 0.16 -> 0.5*0.16 = 0.08,  clipped,   dl/dV = 0
# t3: V=0.2, G=0.0: (V-G)^2 = 0.04, (0.4-G)^2 = 0.16 -> 0.5*0.16 = 0.08,  clipped,   dl/dV = 0
V = [[1.0, 0.5, 1.0, 0.2]]
OLD = [[0.6, 0.6, 0.6, 0.6]]
G = [[0.0, 1.0, 1.2, 0.0]]


def test_hand_worked_clipping_picks_the_larger_branch():
    values, old, ret = _t(V, grad=True), _t(OLD, grad=True), _t(G, grad=True)
    loss, ind = clipped_value_loss(values, old, ret, torch.ones(1, 4))
    torch.testing.assert_close(loss, _t([[0.5, 0.125, 0.08, 0.08]]))
    assert ind["clipped"].tolist() == [[0.0, 0.0, 1.0, 1.0]]
    loss.sum().backward()
    torch.testing.assert_close(values.grad, _t([[1.0, -0.5, 0.0, 0.0]]))
    # the gradient flows only through V
    assert old.grad is None and ret.grad is None


def test_no_clipping_when_none():
    values = _t(V, grad=True)
    loss, ind = clipped_value_loss(values, _t(OLD), _t(G), torch.ones(1, 4), clip_eps_value=None)
    torch.testing.assert_close(loss, _t([[0.5, 0.125, 0.02, 0.02]]))
    assert (ind["clipped"] == 0).all()
    loss.sum().backward()
    torch.testing.assert_close(values.grad, _t([[1.0, -0.5, -0.2, 0.2]]))


def test_wide_clip_range_equals_no_clipping():
    values, old, ret = _t(V), _t(OLD), _t(G)
    wide, ind = clipped_value_loss(values, old, ret, torch.ones(1, 4), clip_eps_value=10.0)
    plain, _ = clipped_value_loss(values, old, ret, torch.ones(1, 4), clip_eps_value=None)
    torch.testing.assert_close(wide, plain)
    assert (ind["clipped"] == 0).all()


@pytest.mark.parametrize("clip", [0.2, None])
def test_masked_positions_are_exactly_zero(clip):
    values = _t([[1.0, NAN, 1.0, 0.2]], grad=True)
    old, ret = _t([[0.6, NAN, 0.6, 0.6]]), _t([[0.0, NAN, 1.2, float("inf")]])
    mask = _t([[1, 0, 1, 0]])
    loss, ind = clipped_value_loss(values, old, ret, mask, clip_eps_value=clip)
    assert loss[0, 1] == 0 and loss[0, 3] == 0 and torch.isfinite(loss).all()
    assert ind["clipped"][0, 1] == 0 and ind["clipped"][0, 3] == 0
    AGGREGATIONS.get("token_mean")(loss, mask).backward()
    assert values.grad[0, 1] == 0 and values.grad[0, 3] == 0
    assert torch.isfinite(values.grad).all()


def test_errors():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError):
        clipped_value_loss(x, x, torch.zeros(2, 4), x)
    with pytest.raises(ValueError, match="clip_eps_value"):
        clipped_value_loss(x, x, x, x, clip_eps_value=-0.1)
