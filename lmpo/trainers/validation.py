"""Start-up checks of a config: values that cannot work fail before any model loads, with
one message that lists every conflict."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing


class ConfigError(ValueError):
    """A config whose values cannot work together."""


@functools.cache
def _literal_choices(cls: type) -> dict[str, tuple]:
    """Field name → the values its `Literal[...]` (or `Literal[...] | None`) type hint allows."""
    choices = {}
    for name, hint in typing.get_type_hints(cls).items():
        optional = ()
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            if len(args) != 1:
                continue
            hint, optional = args[0], (None,)
        if typing.get_origin(hint) is typing.Literal:
            choices[name] = (*typing.get_args(hint), *optional)
    return choices


def literal_problems(cfg) -> list[str]:
    """Each field of the dataclass `cfg` typed `Literal[...]` whose value is none of its choices:
    the command line refuses them as it parses (`lmpo.cli.config.coerce`), the Python API only here."""
    fields = {f.name for f in dataclasses.fields(cfg)}
    return [f"{name}={getattr(cfg, name)!r}: expected one of {', '.join(str(c) for c in allowed if c is not None)}"
            for name, allowed in _literal_choices(type(cfg)).items()
            if name in fields and getattr(cfg, name) not in allowed]


def at_least(cfg, minimum: float, *names: str) -> list[str]:
    return [f"{name}={getattr(cfg, name)} must be >= {minimum}" for name in names if getattr(cfg, name) < minimum]


def optimizer_problems(cfg) -> list[str]:
    problems = at_least(cfg, 0, "warmup_steps", "weight_decay", "grad_clip")
    if not cfg.lr > 0:
        problems.append(f"lr={cfg.lr} must be > 0")
    if not 0 <= cfg.min_lr_ratio <= 1:
        problems.append(f"min_lr_ratio={cfg.min_lr_ratio} must be in [0, 1]")
    default = next(f.default for f in dataclasses.fields(cfg) if f.name == "min_lr_ratio")
    if getattr(cfg, "lr_schedule", "") == "constant" and cfg.min_lr_ratio != default:
        problems.append(f"min_lr_ratio={cfg.min_lr_ratio} is where a cosine or linear decay ends, and "
                        f"lr_schedule=constant does not decay")
    return problems


def checkpoint_problems(cfg) -> list[str]:
    problems = at_least(cfg, 0, "save_every")
    if cfg.save_every and cfg.keep_checkpoints < 1:
        problems.append(f"keep_checkpoints={cfg.keep_checkpoints} must be >= 1 when save_every > 0")
    kept = next(f.default for f in dataclasses.fields(cfg) if f.name == "keep_checkpoints")
    if not cfg.save_every and cfg.keep_checkpoints != kept:
        problems.append(f"keep_checkpoints={cfg.keep_checkpoints} counts checkpoints, and save_every=0 writes none")
    return problems


def reward_problems(cfg) -> list[str]:
    """`rewards`, `reward_model`, `reward_timeout` and `reward_failure` of an RL or online DPO config."""
    from lmpo.envs import parse_reward_weights

    problems = []
    try:
        learned = "rm" in parse_reward_weights(cfg.rewards)
        if learned and not cfg.reward_model:
            problems.append("reward 'rm' needs reward_model: the directory of a trained reward model")
        if cfg.reward_model and not learned:
            problems.append(f"reward_model={cfg.reward_model!r} is read only by the reward 'rm', which rewards="
                            f"{cfg.rewards!r} does not name (add rm=1.0 to use the reward model)")
    except ValueError as err:
        problems.append(str(err))
    if cfg.reward_timeout < 0:
        problems.append(f"reward_timeout={cfg.reward_timeout} must be >= 0 seconds")
    return problems


CHUNKED_TRAINERS = ("rl",)  # the trainers whose log-probs apply the output head in chunks


def run_option_problems(cfg, trainer: str) -> list[str]:
    """The options every trainer shares (`RunOptions`): hardware, precision, LoRA, trackers."""
    problems = at_least(cfg, 0, "lora_r", "logprob_chunk_tokens", "threads") + at_least(cfg, 1, "max_nonfinite_steps")
    if cfg.logprob_chunk_tokens and trainer not in CHUNKED_TRAINERS:
        problems.append(f"logprob_chunk_tokens={cfg.logprob_chunk_tokens} is not used by {trainer}: only RL's "
                        f"log-probs apply the output head in chunks")
    if cfg.lora_r and not cfg.lora_alpha > 0:
        problems.append(f"lora_alpha={cfg.lora_alpha} must be > 0")
    if not 0 <= cfg.lora_dropout < 1:
        problems.append(f"lora_dropout={cfg.lora_dropout} must be in [0, 1)")
    problems += [f"{name}=true needs a LoRA adapter: set lora_r > 0" for name in ("lora_merge", "qlora")
                 if not cfg.lora_r and getattr(cfg, name)]
    if not cfg.lora_r:  # without an adapter these would be ignored in silence
        defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
        problems += [f"{name}={getattr(cfg, name)!r} shapes a LoRA adapter, and there is none: set lora_r > 0, "
                     f"or leave {name} out"
                     for name in ("lora_alpha", "lora_dropout", "lora_target_modules")
                     if name in defaults and getattr(cfg, name) != defaults[name]]
    from lmpo.trainers.trackers import tracker_problems

    return problems + tracker_problems(cfg.report_to)


def raise_if_any(kind: str, problems: list[str], cfg=None) -> None:
    """A `ConfigError` listing `problems`, and with a config `cfg` first its `literal_problems`:
    every config's `validate` passes itself, so that no `Literal` option goes unchecked."""
    if cfg is not None:
        problems = [p for p in literal_problems(cfg) if p not in problems] + problems
    if problems:
        raise ConfigError(f"invalid {kind} config: " + "; ".join(problems))


def sampling_problems(cfg) -> list[str]:
    """`temperature` (and `top_p`, `top_k` where the config has them): checked before any model loads."""
    import math

    problems = []
    if not (cfg.temperature > 0 and math.isfinite(cfg.temperature)):
        problems.append(f"temperature={cfg.temperature} must be > 0 (the loss divides the logits by it; "
                        f"greedy decoding is not sampling)")
    if hasattr(cfg, "top_p") and not 0 < cfg.top_p <= 1:
        problems.append(f"top_p={cfg.top_p} must be in (0, 1]")
    if hasattr(cfg, "top_k") and cfg.top_k < 0:
        problems.append(f"top_k={cfg.top_k} must be >= 0 (0 = off)")
    return problems


def _params(fn) -> list[str]:
    import inspect

    return [name for name, p in inspect.signature(fn).parameters.items() if p.kind == p.KEYWORD_ONLY
            or (p.default is not inspect.Parameter.empty)]


def _not_taken(option: str, value, part: str, name: str, takes: list[str]) -> str:
    return (f"{option}={value!r} is not used by {part}={name} ({name} takes: "
            f"{', '.join(takes) if takes else 'none of these options'})")


# RL options that only some parts read: option -> (the part's config field, the values that read it)
RL_PART_OPTIONS = {
    "std": ("advantage", ("grpo",)), "scale": ("advantage", ("grpo",)),
    "gamma": ("advantage", ("gae", "reinforce_pp")), "gae_lambda": ("advantage", ("gae",)),
    "max_len_norm": ("aggregation", ("seq_mean_token_sum_norm",)),
    "overlong_cache": ("overlong", ("penalty",)), "max_sampling_rounds": ("dynamic_sampling", (True,)),
    "critic_lr": ("critic", ("head", "separate")), "vf_coef": ("critic", ("head", "separate")),
    "clip_eps_value": ("critic", ("head", "separate")),
    "tis_cap": ("engine", ("auto", "vllm")), "probe_tolerance": ("engine", ("auto", "vllm")),
    "vllm_gpu_memory_utilization": ("engine", ("auto", "vllm")),
    "advantage_eps": ("advantage", ("grpo",)),
    "whiten_over": ("whiten_advantages", (True,)), "whiten_eps": ("whiten_advantages", (True,)),
    "whiten_std": ("whiten_advantages", (True,)),
}

# policy-loss options, read by the losses whose functions take a keyword of that name
POLICY_LOSS_OPTIONS = ("clip_eps_low", "clip_eps_high", "dual_clip", "ratio_cap", "ratio_level")


def unused_option_problems(cfg) -> list[str]:
    """An RL option given a value that the selected part never reads (`--loss gspo --dual_clip 3`)
    is an error naming the part and the options it takes; the defaults never trigger it."""
    from lmpo.algos import POLICY_LOSSES

    defaults = type(cfg)()
    problems = []
    if cfg.loss in POLICY_LOSSES:
        takes = [p for p in _params(POLICY_LOSSES.get(cfg.loss))]
        for option in POLICY_LOSS_OPTIONS:
            if getattr(cfg, option) != getattr(defaults, option) and option not in takes:
                problems.append(_not_taken(option, getattr(cfg, option), "loss", cfg.loss, takes))
    problems += algorithm_option_problems(cfg, defaults)
    for option, (part, readers) in RL_PART_OPTIONS.items():
        if getattr(cfg, option) != getattr(defaults, option) and getattr(cfg, part) not in readers:
            takes = [o for o, (p, r) in RL_PART_OPTIONS.items() if p == part and getattr(cfg, part) in r]
            problems.append(_not_taken(option, getattr(cfg, option), part, getattr(cfg, part), takes))
    if cfg.target_kl and not cfg.beta > 0:
        problems.append(f"target_kl={cfg.target_kl} adapts beta, but beta=0 holds no reference model")
    if cfg.kl_horizon != defaults.kl_horizon and not cfg.target_kl:
        problems.append(f"kl_horizon={cfg.kl_horizon} is only used with target_kl > 0")
    return problems


# preference-loss options that only some losses read (the loss functions' keyword names)
PREFERENCE_OPTIONS = ("label_smoothing", "gamma", "discopop_tau")


def algorithm_option_problems(cfg, defaults) -> list[str]:
    """Values of the RL algorithm options that cannot work (`ratio_cap`, `advantage_eps`, `whiten_*`)."""
    problems = []
    if cfg.ratio_cap < 0:
        problems.append(f"ratio_cap={cfg.ratio_cap} must be > 0 (or 0 = off)")
    elif cfg.ratio_cap and (cfg.clip_eps_low, cfg.clip_eps_high) != (defaults.clip_eps_low, defaults.clip_eps_high):
        problems.append(f"ratio_cap={cfg.ratio_cap} replaces the clip range: clip_eps_low/clip_eps_high are not "
                        f"used with it")
    if cfg.advantage_eps < 0 or cfg.whiten_eps < 0:
        problems.append(f"advantage_eps={cfg.advantage_eps} and whiten_eps={cfg.whiten_eps} must be >= 0")
    if cfg.advantage == "grpo" and cfg.scale == "none":
        unread = [f"{o}={getattr(cfg, o)}" for o in ("std", "advantage_eps") if getattr(cfg, o) != getattr(defaults, o)]
        if unread:
            problems.append(f"{', '.join(unread)}: scale=none divides by nothing, so neither std nor "
                            f"advantage_eps is used (scale=group or batch uses them)")
    if cfg.kl_placement == "reward" and cfg.kl_estimator != "k1":
        problems.append(f"kl_estimator={cfg.kl_estimator} with kl_placement=reward: the reward penalty is always "
                        f"k1 (log π_old − log π_ref per token), so the estimator would change only the logged kl; "
                        f"pass --kl_estimator k1, or put the KL in the loss (--kl_placement loss)")
    elif cfg.beta == 0 and cfg.kl_placement == "loss" and cfg.kl_estimator != defaults.kl_estimator:
        problems.append(f"kl_estimator={cfg.kl_estimator} estimates the KL term, but beta=0: there is none "
                        f"(set --beta > 0 to add it)")
    if cfg.whiten_advantages and cfg.whiten_over == "sequences":
        from lmpo.algos import ADVANTAGES

        if cfg.advantage not in ADVANTAGES:
            problems.append(f"whiten_over=sequences needs a per-sequence advantage (grpo, dr_grpo, rloo); "
                            f"{cfg.advantage} gives one per token: use whiten_over=tokens")
    return problems


def preference_option_problems(cfg) -> list[str]:
    """A loss option (`label_smoothing`, `gamma`, `discopop_tau`) given to a loss (or to every part
    of a weighted sum) that does not read it, and values the selected loss cannot take."""
    from lmpo.algos import PREFERENCE_LOSSES

    if cfg.loss not in PREFERENCE_LOSSES:
        return []
    defaults = type(cfg)()
    takes = [p for p in _params(PREFERENCE_LOSSES.get(cfg.loss)) if p in PREFERENCE_OPTIONS]
    problems = [_not_taken(option, getattr(cfg, option), "loss", cfg.loss, takes)
                for option in PREFERENCE_OPTIONS
                if getattr(cfg, option) != getattr(defaults, option) and option not in takes]
    if set(_loss_names(cfg.loss)) == {"sft"} and cfg.beta != defaults.beta:
        problems.append(f"beta={cfg.beta}: loss=sft does not read beta (it would only scale the logged "
                        f"rewards); drop --beta, or mix sft with a loss that reads it (e.g. dpo=1,sft=1)")
    if "discopop_tau" in takes and not cfg.discopop_tau > 0:
        problems.append(f"discopop_tau={cfg.discopop_tau} must be > 0")
    if "exo_pair" in _loss_names(cfg.loss) and not cfg.label_smoothing > 0:
        problems.append(f"label_smoothing={cfg.label_smoothing}: exo_pair takes log(label_smoothing), so it "
                        f"must be > 0 (TRL uses 1e-3)")
    return problems


def _loss_names(spec: str) -> list[str]:
    """The single losses of a loss name or a weighted-sum spec."""
    return [part.partition("=")[0].strip() for part in spec.split(",")]


# read only when the rows come from --data FILE (prompt_field too where no prompt file is read)
DATA_ONLY = ("max_length", "overlong", "chosen_field", "rejected_field", "completion_field", "label_field")
COLUMN_OPTIONS = ("prompt_field", "answer_field", "chosen_field", "rejected_field", "completion_field", "label_field")
TASK_ONLY = ("demonstrations", "corpus_documents", "pairs")  # the task's generated data; unused with --data


def data_option_problems(cfg) -> list[str]:
    """Options of one data source given with the other: `--max_length` without `--data`,
    `--demonstrations` with it, `--heldout_pairs` with `--heldout_data`, `--prompt_pool` with
    `--prompts`. Defaults never trigger it."""
    defaults = type(cfg)()

    def changed(name: str) -> bool:
        return hasattr(cfg, name) and getattr(cfg, name) != getattr(defaults, name)

    problems = []
    if hasattr(cfg, "data"):
        if not cfg.data:
            reads_prompt_files = hasattr(cfg, "prompts") or hasattr(cfg, "eval_prompts")
            read = () if getattr(cfg, "heldout_data", "") else DATA_ONLY  # a held-out file reads them too
            problems += [f"{o}={getattr(cfg, o)!r} is only read with --data FILE (the task's own data is "
                         f"generated)" for o in (*read, *(() if reads_prompt_files else ("prompt_field",)))
                         if changed(o)]
        else:
            problems += [f"{o}={getattr(cfg, o)!r} is not used with --data (the file's rows are used)"
                         for o in TASK_ONLY if changed(o)]
    columns = [(name, getattr(cfg, name)) for name in COLUMN_OPTIONS if hasattr(cfg, name)]
    for i, (name, column) in enumerate(columns):
        other = next((n for n, c in columns[:i] if c == column), None)
        if other:
            problems.append(f"{other} and {name} both name the column {column!r}; each reads a column of its own")
    if getattr(cfg, "heldout_data", "") and changed("heldout_pairs"):
        problems.append(f"heldout_pairs={cfg.heldout_pairs} is not used with --heldout_data (the file's pairs are)")
    if getattr(cfg, "prompts", "") and changed("prompt_pool"):
        problems.append(f"prompt_pool={cfg.prompt_pool} is not used with --prompts (the file's prompts are)")
    if getattr(cfg, "eval_prompts", "") and getattr(cfg, "eval_problems", 1) <= 0:
        problems.append(f"eval_prompts={cfg.eval_prompts!r} is not read with eval_problems={cfg.eval_problems} "
                        f"(nothing is evaluated; eval_problems says how many of its prompts to grade)")
    return problems


def no_heldout_problems(cfg) -> list[str]:
    """With --data and no --eval_prompts there is no held-out evaluation (a task's held-out set says
    nothing of a user's data): `eval_problems` or `eval_max_new_tokens` given a value of one's own
    would shape nothing, and config.json would record it. Defaults and 0 (no evaluation) pass."""
    if not getattr(cfg, "data", "") or getattr(cfg, "eval_prompts", ""):
        return []
    defaults = type(cfg)()
    unless = (" unless --eval_prompts FILE gives its prompts" if hasattr(cfg, "eval_prompts") else
              " (this trainer reads no --eval_prompts; lmpo eval --model RUN/model --eval_prompts FILE grades its model)")
    return [f"{name}={getattr(cfg, name)} shapes the held-out evaluation, and with --data there is none{unless}"
            for name in ("eval_problems", "eval_max_new_tokens")
            if hasattr(cfg, name) and getattr(cfg, name) not in (getattr(defaults, name), 0)]


def single_turn_problems(cfg, task) -> list[str]:
    """`max_turns` and `max_parse_errors` given for a task whose episodes end at their first answer
    (no `make_env`): they would be ignored. `max_turn_tokens` still caps that one turn."""
    if callable(getattr(task, "make_env", None)):
        return []
    defaults = type(cfg)()
    harmless = {"max_turns": (defaults.max_turns, 1), "max_parse_errors": (defaults.max_parse_errors,)}
    name = getattr(task, "name", type(task).__name__)
    return [f"{option}={getattr(cfg, option)} shapes multi-turn episodes, and task {name!r} is single-turn (an "
            f"episode ends at its first answer)" for option, values in harmless.items()
            if getattr(cfg, option) not in values]


def unknown_name_problems(names, known: list[str], what: str) -> list[str]:
    """Each of `names` that is not one of the dotted option names `known`, with the close matches:
    a misspelt name (`rl_stage.betta`) or a leaf without its section (`beta`: `rl_stage.beta`, ...)."""
    import difflib

    problems = []
    for name in sorted(set(names) - set(known)):
        close = ([k for k in known if k.rpartition(".")[2] == name]
                 or difflib.get_close_matches(name, known, n=1, cutoff=0.8))
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        problems.append(f"{what} names {name!r}, which is not an option{hint}")
    return problems
