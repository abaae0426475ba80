import pytest

from lmpo.algos import adaptive_kl_coef

# beta = 0.1, target 6, horizon 10000, n_steps 256 -> n_steps / horizon = 0.0256


def test_rises_above_target_and_falls_below():
    assert adaptive_kl_coef(0.1, 6.6, 6.0, 10000, 256) == pytest.approx(0.1 * (1 + 0.1 * 0.0256))
    assert adaptive_kl_coef(0.1, 5.4, 6.0, 10000, 256) == pytest.approx(0.1 * (1 - 0.1 * 0.0256))
    assert adaptive_kl_coef(0.1, 6.0, 6.0, 10000, 256) == pytest.approx(0.1)
    assert adaptive_kl_coef(0.1, 6.0, 6.0, 10000, 0) == 0.1


@pytest.mark.parametrize("observed", [0.0, 1.0, 4.8, 7.2, 12.0, 1e6])
def test_change_is_bounded_by_the_error_clip(observed):
    beta = adaptive_kl_coef(0.1, observed, 6.0, 10000, 256)
    assert abs(beta / 0.1 - 1) <= 0.2 * 0.0256 + 1e-12
    assert isinstance(beta, float)


def test_saturates_at_plus_minus_20_percent():
    assert adaptive_kl_coef(0.1, 1e6, 6.0, 100, 100) == pytest.approx(0.12)
    assert adaptive_kl_coef(0.1, 0.0, 6.0, 100, 100) == pytest.approx(0.08)


def test_errors():
    with pytest.raises(ValueError, match="target_kl"):
        adaptive_kl_coef(0.1, 1.0, 0.0, 100, 1)
    with pytest.raises(ValueError, match="horizon"):
        adaptive_kl_coef(0.1, 1.0, 1.0, 0, 1)
    with pytest.raises(ValueError, match="n_steps"):
        adaptive_kl_coef(0.1, 1.0, 1.0, 10, -1)
