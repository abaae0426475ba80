"""Checks of a run's inputs against the model's context. Before an RL run's model loads: the
prompt files can be read, every prompt fits the model's context with `max_new_tokens` to spare,
and `--task exact_match` has an answer in every row; each failure is an error naming the file,
the row and the field. For the other trainers: the longest example they may train on, and
CPT's row length, never past the context (a model with learned position embeddings has no
embedding for a position past it, and fails deep in its forward)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace


def model_context(model: str, tokenizer) -> int | None:
    """The model's context length (max_position_embeddings), read from its config only."""
    from lmpo.models import is_preset, preset_config
    from lmpo.models.logprobs import context_length

    if is_preset(model):
        config = preset_config(model, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id,
                               tokenizer.bos_token_id)
    else:
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(model, trust_remote_code=False)
        except ValueError:  # a config of the model's own code: its fields, as written
            try:
                config = SimpleNamespace(**json.loads((Path(model) / "config.json").read_text()))
            except (OSError, ValueError, TypeError):
                return None
        except OSError:
            return None  # loading the model itself will say what is wrong
    return context_length(config)


def example_limit(model: str, tokenizer, max_length: int, flag: str = "max_length") -> tuple[int, str]:
    """The longest example a run may load from a file: `max_length`, or the model's context where
    that is shorter; and how messages name the limit ("" for `max_length` itself)."""
    context = model_context(model, tokenizer)
    if context is None or context >= max_length:
        return max_length, ""
    return context, f"the model's context of {context} tokens ({flag} {max_length} is longer)"


def check_cpt_rows(model: str, tokenizer, seq_len: int) -> None:
    """Refuses CPT rows (seq_len + 1 tokens: each position's target is the next token) that do
    not fit the model's context."""
    context = model_context(model, tokenizer)
    if context is not None and seq_len + 1 > context:
        from lmpo.trainers.validation import ConfigError

        raise ConfigError(f"--seq_len {seq_len}: CPT rows hold seq_len + 1 = {seq_len + 1} tokens, more than the "
                          f"model's context of {context} tokens; use --seq_len {context - 1} or less")


def load_prompt_files(cfg, what: str = "RL") -> dict[str, list]:
    """Loads the prompt files (`--prompts`, `--eval_prompts` where evaluation runs) before a run
    writes or loads anything, refusing rows that do not fit the model's context with the
    completion budget to spare and warning of text the tokenizer cannot represent: {option:
    problems}, which the run then uses (see `lmpo.trainers.prompts`). A trainer without
    `eval_max_new_tokens` evaluates within `max_new_tokens`."""
    if not (cfg.prompts or cfg.eval_prompts):
        return {}
    from lmpo.models import load_tokenizer

    tokenizer = load_tokenizer(cfg.model, cfg.trust_remote_code, cfg.chat_template, cfg.chat_template_kwargs)
    eval_flag = "eval_max_new_tokens" if hasattr(cfg, "eval_max_new_tokens") else "max_new_tokens"
    loaded = {}
    for option, used, flag in (("prompts", True, "max_new_tokens"), ("eval_prompts", cfg.eval_problems > 0, eval_flag)):
        path = getattr(cfg, option)
        if path and used:
            loaded[option] = prompts_within_context(cfg, path, tokenizer, getattr(cfg, flag), flag, what)
    if "prompts" in loaded and "eval_prompts" in loaded:
        warn_shared_prompts([p.prompt for p in loaded["prompts"]], [p.prompt for p in loaded["eval_prompts"][:cfg.eval_problems]],
                            cfg.prompts, cfg.eval_prompts, what)
    return loaded


def warn_shared_prompts(train: list[str], heldout: list[str], train_path: str, eval_path: str, what: str) -> None:
    """Say when held-out prompts are also training prompts: accuracy on them measures what the
    model was trained on, not how it does on new problems (a split made twice, or not at all)."""
    seen = {text.strip() for text in train}
    say_shared_prompts([text for text in heldout if text.strip() in seen], len(heldout), train_path, eval_path, what)


def say_shared_prompts(shared: list[str], heldout: int, train_path: str, eval_path: str, what: str) -> None:
    from lmpo.trainers.distributed import say

    if shared:
        example = " ".join(shared[0].split())
        example = example if len(example) <= 60 else example[:57] + "..."
        say(f"[{what.lower().replace(' ', '_')}] warning: {len(shared)} of the {heldout} held-out prompts "
            f"({100 * len(shared) / heldout:.0f}%) of {eval_path} are also training prompts in {train_path} "
            f"(e.g. {example!r}): held-out accuracy on them measures what training saw", flush=True)


def grades_against_answers(task: str) -> bool:
    """Whether the task of a --task spec compares completions with each prompt row's answer, so
    that its trainer refuses a prompt file with a row without one."""
    return task.partition(":")[0] == "exact_match"


def prompts_within_context(cfg, path: str, tokenizer, new_tokens: int, flag: str, what: str) -> list:
    """The prompts of `path` (`cfg.task` exact_match: each with an answer), each refused unless it
    fits the context of `cfg.model` with `new_tokens` (the option `flag`) to spare."""
    from lmpo.envs.data import load_prompts

    context = model_context(cfg.model, tokenizer)
    limit, where = None, ""
    if context is not None:
        limit = context - new_tokens
        where = f" (the model's context of {context} tokens minus {flag}={new_tokens})"
        if limit < 1:
            from lmpo.trainers.validation import ConfigError

            raise ConfigError(f"invalid {what} config: {flag}={new_tokens} leaves no room for a prompt in the "
                              f"model's context of {context} tokens")
    exact = grades_against_answers(cfg.task)
    unknown: dict = {}
    problems = load_prompts(path, prompt_field=cfg.prompt_field, answer_field=cfg.answer_field, tokenizer=tokenizer,
                            require_answer=exact, max_prompt_tokens=limit, context=where, unknown=unknown)
    for field, consequence in (("prompt", "the model never sees it"),
                               ("answer", "no completion can match those answers")):
        if field in unknown and unknown[field].summary():
            tag = what.lower().replace(" ", "_")
            print(f"[{tag}] {path}: warning: in the {field}s, {unknown[field].summary()}; {consequence}")
    return problems
