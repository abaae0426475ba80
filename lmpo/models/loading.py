"""Load a causal LM and its tokenizer: an embedded preset (fresh weights) or any Hugging Face
model directory or hub id through the ordinary `from_pretrained` path."""

from __future__ import annotations

import contextlib
import errno
import json
import re
from pathlib import Path

import torch
from transformers import (AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedModel,
                          PreTrainedTokenizerBase)

from lmpo.keyed import keyed
from lmpo.models.chat_templates import set_chat_template, set_template_variables
from lmpo.models.hub import check_hub_id
from lmpo.models.lora import (ADAPTER_CONFIG, LoraOptions, adapter_base_name, apply_lora, attach_adapter,
                              check_causal_lm_adapter, is_adapter_dir, is_peft_model, qlora_quantization_config,
                              save_lora)
from lmpo.models.presets import PRESETS, is_preset, preset_config
from lmpo.models.tokenizer import build_char_tokenizer


def load_tokenizer(name_or_path: str, trust_remote_code: bool = False, chat_template: str = "",
                   chat_template_kwargs: str = "") -> PreTrainedTokenizerBase:
    """The embedded tokenizer for a preset name, else `AutoTokenizer.from_pretrained`
    (`trust_remote_code`: run the Python code a model directory ships, see `_check_local_path`).
    `chat_template`: a Jinja file that replaces the tokenizer's template (or gives a base model
    one); saved with the tokenizer, it stays with the models trained from it.
    `chat_template_kwargs`: a JSON object of the template's variables (`{"enable_thinking":
    false}`), written into the template (see `_set_template_variables`), so it stays too.

    A tokenizer without a pad token gets its EOS token as pad, the usual convention."""
    if is_preset(name_or_path):
        tok = build_char_tokenizer()
    else:
        _check_local_path(name_or_path, trust_remote_code)
        _check_tokenizer_files(Path(name_or_path))
        tok = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise ValueError(f"tokenizer at {name_or_path!r} has neither a pad nor an eos token")
        tok.pad_token = tok.eos_token
    if chat_template:
        set_chat_template(tok, chat_template)
    if chat_template_kwargs:
        set_template_variables(tok, chat_template_kwargs)
    tok._lmpo_stop_ids = () if is_preset(name_or_path) else _generation_stop_ids(name_or_path, trust_remote_code)
    return tok


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "merges.txt", "spiece.model", "sentencepiece.bpe.model")
"""Files one of which a saved tokenizer writes (tiktoken-style tokenizers: a `*.tiktoken` file)."""


def _check_tokenizer_files(path: Path) -> None:
    """A local model directory without a tokenizer: transformers then builds an empty tokenizer
    of the model's type that turns every text into no tokens, and a run would train on nothing."""
    if not path.is_dir() or any((path / name).is_file() for name in TOKENIZER_FILES) or any(path.glob("*.tiktoken")):
        return
    raise FileNotFoundError(f"{path} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}): save the "
                            f"tokenizer the model was trained with beside it (tokenizer.save_pretrained({path}))")


def _generation_stop_ids(name_or_path: str, trust_remote_code: bool) -> tuple[int, ...]:
    """The EOS ids of the model's generation config, as transformers loads it with the model
    (its `generation_config.json`, else derived from its config; a LoRA adapter's directory
    loads as its base). Data files end assistant turns on them, as sampling stops on them (see
    `lmpo.envs.data.chat.turn_end_ids`). Empty where there is none to read: loading the model
    says what is wrong."""
    try:
        source = adapter_base_name(name_or_path) if is_adapter_dir(name_or_path) else name_or_path
    except (OSError, ValueError):
        return ()
    try:
        config = GenerationConfig.from_pretrained(source)
    except (OSError, ValueError):
        try:
            config = GenerationConfig.from_model_config(AutoConfig.from_pretrained(
                source, trust_remote_code=trust_remote_code))
        except (OSError, ValueError):
            return ()
    eos = config.eos_token_id
    return tuple(token for token in (eos if isinstance(eos, (list, tuple)) else [eos]) if isinstance(token, int))


_DROPOUT_RATE = re.compile(r"(dropout|pdrop|layerdrop)$")


def disable_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """Set every dropout probability in `model` to 0: `nn.Dropout` modules and the float rates
    modules keep for functional dropout (`attention_dropout`, `dropout`, Bloom's and Falcon's
    `hidden_dropout`, any `*_dropout` or `*_pdrop`) or to skip whole layers (OPT's `layerdrop`).
    Falcon reads its rates from the config at every forward, so the config's rates are set to 0
    too; `save_model` writes the original ones, so a saved model keeps its own settings.

    Why: sampling and reference log-probs run in eval mode, the policy's loss forward in train
    mode; with dropout on, the first step would already see a non-zero KL, a first DPO loss other
    than ln 2, and, with several updates per batch (π_old the sampler's), a ratio away from 1."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for name, value in vars(module).items():
            if isinstance(value, float) and _DROPOUT_RATE.search(name):
                setattr(module, name, 0.0)
    config = getattr(model, "config", None)
    if config is not None:
        rates = {name: value for name, value in vars(config).items()
                 if isinstance(value, float) and value and _DROPOUT_RATE.search(name)}
        for name in rates:
            setattr(config, name, 0.0)
        model._lmpo_config_dropout = {**getattr(model, "_lmpo_config_dropout", {}), **rates}
    return model


@contextlib.contextmanager
def original_dropout(model: torch.nn.Module):
    """While saving: the config holds the dropout rates it was loaded with (see `disable_dropout`)."""
    config, rates = getattr(model, "config", None), getattr(model, "_lmpo_config_dropout", {})
    for name, value in rates.items():
        setattr(config, name, value)
    try:
        yield
    finally:
        for name in rates:
            setattr(config, name, 0.0)


@contextlib.contextmanager
def no_progress_bars():
    """transformers' progress bars off for a block (a run saves a model at every checkpoint:
    one "Writing model shards" bar each in a Python caller's output), then as they were."""
    from transformers.utils import logging

    was_on = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            logging.enable_progress_bar()


def load_model(name_or_path: str, tokenizer: PreTrainedTokenizerBase, seed: int = 0,
               dtype: torch.dtype = torch.float32, keep_dropout: bool = True,
               lora: LoraOptions | None = None, resume_adapter: str | None = None,
               trust_remote_code: bool = False) -> PreTrainedModel:
    """A fresh preset model (initialised from `seed`) or `AutoModelForCausalLM.from_pretrained`;
    `keep_dropout=False` disables its dropout (see `disable_dropout`).

    A directory holding a PEFT adapter (e.g. a LoRA stage's output) loads as its base model
    (`base_model_name_or_path`; a preset is rebuilt from `seed`) with the adapter merged in.
    `lora` then wraps the model in a fresh LoRA adapter (a `PeftModel`), so that with the adapter
    disabled it is exactly the model loaded: the right reference for the next stage. With
    `lora.qlora` the base is loaded in 4-bit on the current CUDA GPU. `resume_adapter` (with `lora`)
    attaches the adapter saved in that directory, trainable, instead of a fresh one: resuming a
    run, where `name_or_path` is the run's own starting model. `trust_remote_code`: run the Python
    code a model directory ships (refused otherwise, see `_check_local_path`)."""
    if resume_adapter is not None and lora is None:
        raise ValueError("resume_adapter needs lora options: it resumes a LoRA run")
    model = _load_base(name_or_path, tokenizer, seed, dtype, lora is not None and lora.qlora, trust_remote_code)
    if not keep_dropout:
        disable_dropout(model)
    return model if lora is None else apply_lora(model, lora, resume_from=resume_adapter)


def _load_base(name_or_path: str, tokenizer: PreTrainedTokenizerBase, seed: int, dtype: torch.dtype,
               quantize_4bit: bool = False, trust_remote_code: bool = False) -> PreTrainedModel:
    if is_adapter_dir(name_or_path):
        check_causal_lm_adapter(name_or_path)
        base = _load_base(adapter_base_name(name_or_path), tokenizer, seed, dtype, quantize_4bit, trust_remote_code)
        model = attach_adapter(base, name_or_path, trainable=False).merge_and_unload()
        model.name_or_path = str(Path(name_or_path).resolve())  # a next adapter names this one as its base
        # an ordinary model now, trainable as one loaded from a full checkpoint (the adapter's base was
        # frozen under it, and merging keeps that: a full fine-tuning stage had nothing to train)
        return model.requires_grad_(True)
    if is_preset(name_or_path):
        if quantize_4bit:
            raise ValueError(f"QLoRA quantises a pretrained base; preset {name_or_path!r} is built fresh, use plain LoRA")
        config = preset_config(name_or_path, len(tokenizer), tokenizer.pad_token_id,
                               tokenizer.eos_token_id, tokenizer.bos_token_id)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.name_or_path = name_or_path  # an adapter on it names the preset (rebuilt from the same seed)
        return model
    _check_local_path(name_or_path, trust_remote_code)
    if quantize_4bit:
        return name_by_path(AutoModelForCausalLM.from_pretrained(
            name_or_path, quantization_config=qlora_quantization_config(), dtype=torch.bfloat16,
            device_map={"": torch.cuda.current_device()}, trust_remote_code=trust_remote_code), name_or_path)
    model, info = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype, trust_remote_code=trust_remote_code,
                                                       output_loading_info=True)
    name_by_path(model, name_or_path)
    architectures = getattr(model.config, "architectures", None) or []
    if info["missing_keys"]:  # transformers initialises them at random, with a report lmpo keeps quiet
        missing = sorted(info["missing_keys"])
        raise ValueError(f"{name_or_path}: its checkpoint has no {', '.join(missing[:3])}"
                         f"{f' (and {len(missing) - 3} more)' if len(missing) > 3 else ''}, which would start "
                         f"from random values: it was saved as a {(architectures or ['another kind of model'])[0]}, "
                         f"not a causal LM")
    if architectures and all(str(a).endswith(OTHER_HEADS) for a in architectures):
        # a tied output head is the embedding, so nothing is missing: it loads, as a language model
        # whose trunk was trained for another head (a reward model's, say)
        raise ValueError(f"{name_or_path}: it was saved as a {architectures[0]}, not a causal LM; give the model "
                         f"it was trained from, or a causal LM's directory")
    return model


def name_by_path(model: PreTrainedModel, name_or_path: str) -> PreTrainedModel:
    """A model loaded from a local directory names its absolute path, which an adapter trained on
    it records as its base (`base_model_name_or_path`): found from any working directory later."""
    if Path(name_or_path).is_dir():
        model.name_or_path = str(Path(name_or_path).resolve())
    return model


OTHER_HEADS = ("ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering")
"""Architectures whose checkpoints are not language models, though a tied output head loads from them."""


def _check_local_path(name_or_path: str, trust_remote_code: bool = False) -> None:
    """Fail clearly on a missing or non-model local directory instead of trying a model hub, and
    on a directory whose model or tokenizer is its own Python code (`auto_map`) unless
    `trust_remote_code`: loading runs that code. (transformers would ask on the terminal, mid-run,
    and again for every copy it loads.)"""
    path = Path(name_or_path)
    looks_local = name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") >= 2
    if path.is_file():  # `--model DIR/config.json`, `--model model.safetensors`
        model_dir, run = _model_dir_of(path)
        raise keyed(FileNotFoundError(f"{path} is a file; a model is given as its directory{_directory_of(path)}"),
                    "model.is_file", path=path, model_dir=model_dir, run=run)
    run_dir = (path / "run.json").is_file() and (path / "config.json").is_file()  # an RL run's: its options
    if path.exists() and (run_dir or not (path / "config.json").exists()) and not is_adapter_dir(path):
        inside = _models_inside(path)
        hint = (f"; it holds a model: {inside[0]}; give {inside[0]} instead" if len(inside) == 1 else
                f"; it holds models: {', '.join(map(str, inside))}" if inside else "")
        why = "a run directory (its config.json holds the run's options)" if run_dir else "it has no config.json"
        raise keyed(FileNotFoundError(f"{path} is not a Hugging Face model directory: {why}{hint}"),
                    "model.not_model_dir", path=path, run_dir=run_dir, inside=inside)
    if not path.exists() and looks_local:
        raise keyed(FileNotFoundError(f"model directory {path} does not exist (presets: {', '.join(PRESETS)})"),
                    "model.no_dir", path=path, presets=", ".join(PRESETS))
    if not trust_remote_code and (code := remote_code(path)):
        raise keyed(ValueError(f"{path} is a model with its own Python code ({', '.join(code)}); loading it runs "
                               f"that code, which lmpo does only with --trust_remote_code true"),
                    "model.remote_code", path=path, code=", ".join(code))
    if not path.exists():
        check_hub_id(name_or_path)
    elif is_adapter_dir(path):
        _check_adapter_base(path, trust_remote_code)


def _directory_of(file: Path) -> str:
    """` (DIR)`, the model directory a file given as --model stands for: its own directory, or
    the model a run directory holds (its config.json is the run's options, refused next)."""
    model_dir, run = _model_dir_of(file)
    if run:
        return f" ({model_dir}: {run} is a run directory, and its model is there)"
    return f" ({model_dir})" if model_dir else ""


def _model_dir_of(file: Path) -> tuple[Path | None, Path | None]:
    """(The model directory a file given as --model stands for, the run directory that holds it)."""
    parent = file.parent
    if (parent / "run.json").is_file():
        inside = _models_inside(parent)
        return (inside[0], parent) if inside else (None, None)
    return (parent, None) if (parent / "config.json").is_file() or is_adapter_dir(parent) else (None, None)


def _check_adapter_base(adapter: Path, trust_remote_code: bool) -> None:
    """The base model an adapter directory names, checked before anything loads (without it a base
    that is not found from here costs a minute of Hub retries, then an error that does not say
    where the name came from)."""
    base = adapter_base_name(adapter)
    if is_preset(base):
        return
    try:
        _check_local_path(base, trust_remote_code)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"the adapter in {adapter} names its base model {base!r} (base_model_name_or_path "
                                f"in its {ADAPTER_CONFIG}; a relative path is read from the current directory, "
                                f"{Path.cwd()}), which is not found: {err}. Set that field to the base's "
                                f"path") from None


def check_model_source(name_or_path: str, trust_remote_code: bool = False) -> None:
    """What loading `name_or_path` would refuse first (a missing directory, a directory that holds
    no model, code it would run, a Hub id this offline machine does not have), checked before a
    run writes anything."""
    if not is_preset(name_or_path):
        _check_local_path(name_or_path, trust_remote_code)


def _models_inside(path: Path, most: int = 4) -> list[Path]:
    """Saved models a run or pipeline directory holds (`RUN/model`, `PIPELINE/STAGE/model`), for
    the error that a run directory given as --model gets: the model is one level further in."""
    found = []
    for pattern in ("model", "*/model"):
        found += sorted(m for m in path.glob(pattern) if (m / "config.json").is_file() or is_adapter_dir(m))
    if not found:  # an interrupted run: no final model yet, but the weights of its newest checkpoint
        found = sorted(m for m in path.glob("checkpoints/step_*") if (m / "COMPLETE").is_file()
                       and ((m / "config.json").is_file() or is_adapter_dir(m)))[-1:]
    return found[:most]


def remote_code(path: Path) -> list[str]:
    """The classes a model directory's `auto_map` points at in its own Python files."""
    found = []
    for name in ("config.json", "tokenizer_config.json"):
        try:
            auto_map = json.loads((path / name).read_text()).get("auto_map") or {}
        except (OSError, ValueError, AttributeError):
            continue
        for target in auto_map.values():
            for ref in target if isinstance(target, list) else [target]:
                if isinstance(ref, str) and ref not in found:
                    found.append(ref)
    return found


def load_model_and_tokenizer(name_or_path: str, seed: int = 0,
                             dtype: torch.dtype = torch.float32) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """(model, tokenizer) of a preset, a Hugging Face id or a directory: `load_tokenizer`, then
    `load_model` with its defaults (a preset's weights are initialised from `seed`)."""
    tokenizer = load_tokenizer(name_or_path)
    return load_model(name_or_path, tokenizer, seed=seed, dtype=dtype), tokenizer


def save_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path,
               merged: bool = False) -> Path:
    """Write an ordinary Hugging Face model directory (safetensors + tokenizer); for a LoRA model,
    its adapter directory, and with `merged` the merged model in its merged/ (see `save_lora`).
    The config keeps the model's own dropout rates, which training set to 0."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    try:
        with original_dropout(model.get_base_model() if is_peft_model(model) else model), no_progress_bars():
            if is_peft_model(model):
                save_lora(model, tokenizer, out, merged=merged)
            else:
                model.save_pretrained(out, safe_serialization=True)
                tokenizer.save_pretrained(out)
    except Exception as err:  # safetensors reports a full disk as its own error type, not OSError
        if isinstance(err, OSError) or not any(s in str(err) for s in ("No space left", "os error 28")):
            raise
        raise OSError(errno.ENOSPC, "No space left on device", str(out)) from err
    return out


def saved_state_dict(model: PreTrainedModel, directory: str | Path) -> dict[str, torch.Tensor]:
    """The weights `save_pretrained` wrote to `directory` from a model like `model`, named as in
    `model.state_dict()`. transformers renames some architectures' weights on the way to disk and
    back when it loads them (GPT-NeoX's `lm_head` is saved as `embed_out`, fused mixture-of-experts
    weights are split per expert): only its own loading undoes that, so the directory is loaded with it."""
    dtype = next(model.parameters()).dtype
    with no_progress_bars():
        return type(model).from_pretrained(directory, dtype=dtype).state_dict()


def count_parameters(model: torch.nn.Module) -> int:
    """The number of parameters of `model`, trainable or not (see `parameter_counts`)."""
    return sum(p.numel() for p in model.parameters())
