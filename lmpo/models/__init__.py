"""Tokenizers and causal language models: embedded presets and any Hugging Face model."""

from lmpo.models.compile import check_compiler, compile_blocks, uncompiled_blocks
from lmpo.models.device import (Precision, autocast, choose_precision, cpu_has_native_bf16, peak_rss_mb,
                                resolve_device, reuse_freed_host_memory, without_cpu_hub_kernels)
from lmpo.models.loading import (check_model_source, count_parameters, disable_dropout, is_preset, load_model, load_model_and_tokenizer,
                                 load_tokenizer, save_model, saved_state_dict)
from lmpo.models.logprobs import TokenOutputs, completion_logprobs, completion_outputs, positions_from_mask
from lmpo.models.lora import (AdapterDisabled, LoraOptions, adapter_disabled, apply_lora, is_adapter_dir, is_peft_model, merged_copy,
                              reference_logprobs, save_lora, trainable_parameters)
from lmpo.models.memory import (ParameterCounts, enable_gradient_checkpointing, micro_batches, parameter_bytes,
                                parameter_counts)
from lmpo.models.presets import PRESETS, preset_config
from lmpo.models.tokenizer import build_char_tokenizer
from lmpo.models.value import ValueHead, ValueModel

__all__ = ["PRESETS", "AdapterDisabled", "LoraOptions", "ParameterCounts", "Precision", "TokenOutputs", "ValueHead", "ValueModel",
           "adapter_disabled", "apply_lora", "autocast", "build_char_tokenizer", "check_compiler", "check_model_source", "choose_precision", "compile_blocks",
           "completion_logprobs", "completion_outputs", "count_parameters", "cpu_has_native_bf16", "disable_dropout",
           "enable_gradient_checkpointing", "is_adapter_dir", "is_peft_model", "is_preset", "load_model",
           "load_model_and_tokenizer", "load_tokenizer", "merged_copy", "micro_batches", "parameter_bytes",
           "parameter_counts", "peak_rss_mb", "positions_from_mask", "preset_config", "reference_logprobs", "resolve_device", "reuse_freed_host_memory",
           "save_lora", "saved_state_dict", "save_model", "trainable_parameters", "uncompiled_blocks", "without_cpu_hub_kernels"]
