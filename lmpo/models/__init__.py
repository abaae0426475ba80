"""Tokenizers and causal language models: embedded presets and any Hugging Face model."""

from lmpo.models.loading import (count_parameters, disable_dropout, is_preset, load_model, load_model_and_tokenizer,
                                 load_tokenizer, save_model)
from lmpo.models.logprobs import TokenOutputs, completion_logprobs, completion_outputs, positions_from_mask
from lmpo.models.presets import PRESETS, preset_config
from lmpo.models.tokenizer import build_char_tokenizer
from lmpo.models.value import ValueHead, ValueModel

__all__ = ["PRESETS", "TokenOutputs", "ValueHead", "ValueModel", "completion_logprobs", "completion_outputs", "positions_from_mask", "build_char_tokenizer", "count_parameters", "disable_dropout", "is_preset", "load_model",
           "load_model_and_tokenizer", "load_tokenizer", "preset_config", "save_model"]
