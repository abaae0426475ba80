"""LoRA and QLoRA through PEFT: adapters on a frozen base, the base as the reference model,
and adapter (or merged) checkpoints.

peft is imported on first use, so importing `lmpo.models` stays fast for runs without LoRA.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
import warnings
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import torch

from lmpo.models.logprobs import completion_outputs

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

ADAPTER_CONFIG = "adapter_config.json"
MERGED_SUBDIR = "merged"


@dataclass
class LoraOptions:
    """A LoRA adapter: each targeted weight W becomes W + (alpha / r) * B A, with A [r, in] and
    B [out, r] trained and W frozen. B starts at 0, so a fresh adapter leaves the model unchanged."""

    r: int = 16
    """Rank of the update. Larger fits more, with more adapter parameters (r x (in + out) per layer)."""
    alpha: float = 16.0
    """Scale numerator: the update is multiplied by alpha / r (1 at the defaults; alpha = 2r makes
    it 2). The same default as the trainers' `lora_alpha`."""
    dropout: float = 0.0
    """Dropout on the adapter's input in train mode. 0 by default for the reasons `disable_dropout`
    gives: dropout makes the first step's KL non-zero and, with several updates per batch, its ratio
    differ from 1."""
    target_modules: str | list[str] = "all-linear"
    """Which layers get adapters: "all-linear" (every linear layer but the output head) or module
    names such as ["q_proj", "v_proj"]."""
    qlora: bool = False
    """Load the frozen base in 4-bit NF4 (bitsandbytes, CUDA only), compute in bf16: about a quarter
    of the base's bf16 memory, at some speed and a small quantisation error in the base."""
    modules_to_save: list[str] = field(default_factory=list)
    """Layers trained in full beside the adapters (e.g. ["lm_head"]); none by default."""

    def __post_init__(self) -> None:
        if self.r <= 0 or self.alpha <= 0:
            raise ValueError(f"LoRA rank and alpha must be positive, got r={self.r}, alpha={self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoRA dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules:  # PEFT's own refusal names target_parameters, an option lmpo has not
            raise ValueError("LoRA target_modules (--lora_target_modules) names no layer: give names such as "
                             "q_proj,v_proj, or all-linear")


def is_peft_model(model: torch.nn.Module) -> bool:
    """Whether `model` is a PEFT (LoRA) wrapper; never imports peft to find out."""
    peft = sys.modules.get("peft")  # no model can be a PeftModel if peft was never imported
    return peft is not None and isinstance(model, peft.PeftModel)


def is_adapter_dir(path: str | Path) -> bool:
    """A directory holding a PEFT adapter (and no full model)."""
    path = Path(path)
    return (path / ADAPTER_CONFIG).is_file() and not (path / "config.json").is_file()


def check_qlora_available(device: torch.device | None = None) -> None:
    """Raise a clear error where QLoRA cannot run: it needs bitsandbytes and a CUDA GPU."""
    if (device is not None and device.type != "cuda") or not torch.cuda.is_available():
        raise ValueError("QLoRA (4-bit base) needs a CUDA GPU; on this machine use LoRA without qlora")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ValueError("QLoRA needs the bitsandbytes package: pip install bitsandbytes")


def qlora_quantization_config():
    """The `BitsAndBytesConfig` for a QLoRA base: NF4 weights, double quantisation, bf16 compute."""
    from transformers import BitsAndBytesConfig

    check_qlora_available()
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=torch.bfloat16)


def apply_lora(model: PreTrainedModel, opts: LoraOptions, resume_from: str | Path | None = None) -> PeftModel:
    """Freeze `model` and wrap it with a fresh LoRA adapter, or with the trainable adapter saved in
    `resume_from` (to resume a run); only the adapter is trainable. A QLoRA base must have been
    loaded in 4-bit already (`load_model(..., lora=opts)` does that)."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if opts.qlora:
        if not getattr(model, "is_loaded_in_4bit", False):
            raise ValueError("qlora needs the base loaded in 4-bit: load it with load_model(..., lora=opts)")
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if resume_from is not None:
        return attach_adapter(model, resume_from, trainable=True)
    if isinstance(opts.target_modules, list):
        _check_targets(model, opts.target_modules)
    _check_tied(model, opts.target_modules if isinstance(opts.target_modules, list) else [], opts.modules_to_save)
    # a reward model is a sequence classifier: PEFT then also trains its score head in full
    task_type = "SEQ_CLS" if type(model).__name__.endswith("ForSequenceClassification") else "CAUSAL_LM"
    config = LoraConfig(r=opts.r, lora_alpha=opts.alpha, lora_dropout=opts.dropout, bias="none",
                        target_modules=opts.target_modules, modules_to_save=opts.modules_to_save or None,
                        task_type=task_type)
    with _quiet_peft():
        return get_peft_model(model, config)


def _check_targets(model: torch.nn.Module, targets: list[str]) -> None:
    """Refuses a target name that matches no layer, as PEFT matches names (the module's name, or its
    last dotted parts), rather than training adapters on the names that did match and ignoring it."""
    names = [name for name, _ in model.named_modules() if name]
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                         if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D"})  # GPT-2's
        raise ValueError(f"LoRA target module(s) {', '.join(missing)} match no layer of this "
                         f"{type(model).__name__}; its linear layers are named {', '.join(linear)} (or use all-linear)")


def _check_tied(model: torch.nn.Module, targets: list[str], saved: list[str]) -> None:
    """Refuses an adapter on, or a full copy of, the input embeddings or the output head of a model
    that ties them: merging it (and loading it, which merges) changes both sides of the one weight,
    so the merged model is not the one trained (a logit difference of 20 on a tied Qwen2.5)."""
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    if head is None or embed is None or head.weight is not embed.weight:
        return
    tied = {name for name, module in model.named_modules() if name and module in (head, embed)}
    hit = sorted({t for t in [*targets, *saved] for name in tied if name == t or name.endswith("." + t)})
    if hit:
        raise ValueError(f"LoRA on {', '.join(hit)}: this {type(model).__name__} ties its output head to its input "
                         f"embeddings (one weight), and an adapter or a trained copy of either would change both "
                         f"when merged; leave them out (all-linear does), or train without LoRA")


def attach_adapter(base: PreTrainedModel, adapter_dir: str | Path, trainable: bool = True) -> PeftModel:
    """`base` with the adapter saved in `adapter_dir` (trainable, to continue training it)."""
    from peft import PeftModel

    with _quiet_peft():
        return PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=trainable)


@contextmanager
def _quiet_peft() -> Iterator[None]:
    """peft asks transformers a question under a name transformers 5 deprecated: a warning per load."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
        yield


def adapter_base_name(adapter_dir: str | Path) -> str:
    """The base model an adapter directory was trained on (`base_model_name_or_path`)."""
    path = Path(adapter_dir)
    base = json.loads((path / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    if not base:
        raise ValueError(f"the adapter in {path} does not name its base model (base_model_name_or_path)")
    if base.startswith(("/", ".", "~")) and not Path(base).expanduser().exists():
        raise FileNotFoundError(f"the adapter in {path} was trained on {base} (base_model_name_or_path in its "
                                f"{ADAPTER_CONFIG}), which does not exist: put the base model back there, or set "
                                f"that field to where it is now")
    return base


def check_causal_lm_adapter(adapter_dir: str | Path) -> None:
    """Refuses an adapter for another task (a LoRA reward model's, SEQ_CLS) where a causal LM is
    loaded: merged into one, its score head would be dropped and its trunk, trained to score, would
    generate. A full reward model is refused there too (`loading._load_base`)."""
    path = Path(adapter_dir)
    task = json.loads((path / ADAPTER_CONFIG).read_text()).get("task_type")
    if task not in (None, "CAUSAL_LM"):
        raise ValueError(f"{path}: it is a {task} adapter (a reward model's, from `lmpo train rm --lora_r`), not a "
                         f"causal LM's; give the model it was trained from, or a causal LM's directory")


def adapter_disabled(model: torch.nn.Module) -> AbstractContextManager:
    """Inside, a LoRA model computes as its frozen base: the reference model without a copy."""
    if not is_peft_model(model):
        raise TypeError(f"{type(model).__name__} has no adapter to disable; a full fine-tune needs its own reference copy")
    return model.disable_adapter()


@torch.no_grad()
def reference_logprobs(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                       completion_ids: torch.Tensor, temperature: float = 1.0, chunk_tokens: int = 0) -> torch.Tensor:
    """Log-probs [B, T] of the completions under the base model (the adapter off), fp32, no grad."""
    with adapter_disabled(model):
        return completion_outputs(model, prompt_ids, prompt_mask, completion_ids, temperature,
                                  chunk_tokens=chunk_tokens).logprobs


def save_lora(model: PeftModel, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path, merged: bool = False,
              base_name_or_path: str | None = None) -> Path:
    """Write the adapter (adapter_config.json + adapter_model.safetensors) and the tokenizer to
    `out_dir`, loadable with `PeftModel.from_pretrained(base, out_dir)` or `load_model(out_dir)`.

    `merged=True` also writes the full model with the adapter merged into `out_dir/merged`, an
    ordinary model directory; the merge runs on a copy (the model keeps training), so it needs
    the memory of a second model for the duration. `base_name_or_path` overrides the base the
    adapter names, e.g. for a base that was not loaded from a directory."""
    if not is_peft_model(model):
        raise TypeError(f"{type(model).__name__} has no LoRA adapter to save")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # the embeddings carry no adapter; "auto" would look the base's config up, on the Hub for a preset name
    model.save_pretrained(out, safe_serialization=True, save_embedding_layers=False)
    if base_name_or_path is not None:
        config_path = out / ADAPTER_CONFIG
        config = json.loads(config_path.read_text())
        config["base_model_name_or_path"] = base_name_or_path
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True))
    tokenizer.save_pretrained(out)
    if merged:
        merged_model = merged_copy(model)
        merged_model.save_pretrained(out / MERGED_SUBDIR, safe_serialization=True)
        tokenizer.save_pretrained(out / MERGED_SUBDIR)
        del merged_model
    return out


def merged_copy(model: PeftModel) -> PreTrainedModel:
    """A plain model with the adapter folded into its weights; `model` itself is left as it is."""
    return copy.deepcopy(model).merge_and_unload()


def trainable_parameters(model: torch.nn.Module) -> Iterator[torch.nn.Parameter]:
    """The parameters an optimizer should get: the adapter's only, under LoRA."""
    return (p for p in model.parameters() if p.requires_grad)



class AdapterDisabled:
    """A LoRA policy seen as its frozen base: the KL reference without a second copy. Calls run
    in eval mode with the adapter disabled and no gradient; the policy's mode is restored."""

    def __init__(self, model: torch.nn.Module):
        if not is_peft_model(model):
            raise TypeError(f"{type(model).__name__} has no adapter to disable")
        self.model = model

    def __call__(self, *args, **kwargs):
        with self.as_reference() as base:
            return base(*args, **kwargs)

    @contextmanager
    def as_reference(self) -> Iterator[torch.nn.Module]:
        """The policy itself, computing as its base: for `completion_outputs` to run the same
        (packed) forward on it as on the policy, so that the two differ by the adapter alone."""
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad(), adapter_disabled(self.model):
                yield self.model
        finally:
            self.model.train(was_training)

    def parameters(self):
        return self.model.parameters()

    @property
    def config(self):
        return self.model.config
