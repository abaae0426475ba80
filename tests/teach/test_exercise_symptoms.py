"""The generic wording of a difference says only what the numbers show."""

import torch

from lmpo.teach.exercise.core import _constant_ratio


def test_a_single_number_is_not_called_the_reference_times_a_constant():
    assert _constant_ratio((torch.tensor(0.7),), (torch.tensor(0.9),)) is None
    assert _constant_ratio((torch.tensor([0.0, 0.5, 0.0]),), (torch.tensor([0.0, 1.0, 0.0]),)) is None


def test_a_constant_ratio_over_several_numbers_is_named():
    assert abs(_constant_ratio((torch.tensor([0.5, -1.0]),), (torch.tensor([1.0, -2.0]),)) - 2.0) < 1e-9
