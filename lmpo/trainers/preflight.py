"""Checks of an RL run's inputs before any model loads: the prompt files can be read, every
prompt fits the model's context with `max_new_tokens` to spare, and `--task exact_match`
has an answer in every row. Each failure is an error naming the file, the row and the field."""

from __future__ import annotations


def model_context(model: str, tokenizer) -> int | None:
    """The model's context length (max_position_embeddings), read from its config only."""
    from lmpo.models import is_preset, preset_config

    if is_preset(model):
        config = preset_config(model, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id,
                               tokenizer.bos_token_id)
    else:
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(model)
        except (OSError, ValueError):
            return None  # loading the model itself will say what is wrong
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_rl_inputs(cfg) -> None:
    if not (cfg.prompts or cfg.eval_prompts):
        return
    from lmpo.envs.data import load_prompts
    from lmpo.models import load_tokenizer

    tokenizer = load_tokenizer(cfg.model)
    context = model_context(cfg.model, tokenizer)
    exact = cfg.task.partition(":")[0] == "exact_match"
    for path, used, new_tokens, flag in ((cfg.prompts, True, cfg.max_new_tokens, "max_new_tokens"),
                                         (cfg.eval_prompts, cfg.eval_problems > 0, cfg.eval_max_new_tokens,
                                          "eval_max_new_tokens")):
        if not (path and used):
            continue
        limit, where = None, ""
        if context is not None:
            limit = context - new_tokens
            where = f" (the model's context of {context} tokens minus {flag}={new_tokens})"
            if limit < 1:
                from lmpo.trainers.validation import ConfigError

                raise ConfigError(f"invalid RL config: {flag}={new_tokens} leaves no room for a prompt in the "
                                  f"model's context of {context} tokens")
        load_prompts(path, tokenizer=tokenizer, require_answer=exact, max_prompt_tokens=limit, context=where)
