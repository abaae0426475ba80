"""The typed configuration of the RL loop. Names follow the papers (see ALGORITHMS.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lmpo.trainers.harness import RunOptions
from lmpo.trainers.prompts import PromptFileOptions
from lmpo.trainers.collapse_guard import GuardOptions, guard_problems
from lmpo.trainers.reward_options import RewardOptions
from lmpo.trainers.stopping import StoppingOptions, stopping_problems
from lmpo.trainers.runtime import Schedule
from lmpo.trainers.validation import (at_least, checkpoint_problems, data_option_problems, literal_problems,
                                     optimizer_problems, raise_if_any, reward_problems, sampling_problems,
                                     unused_option_problems)


@dataclass
class RLConfig(RunOptions, StoppingOptions, GuardOptions, RewardOptions, PromptFileOptions):
    model: str = "runs/sft/model"
    """Hugging Face model directory (or preset name) of the policy to start from; also the reference."""
    task: str = "sort_digits"
    """Task that supplies prompts, the verifier and the held-out evaluation."""
    out: str = "runs/grpo"
    """Run directory: metrics.jsonl, checkpoints/, the final model in `model/`, the report."""
    resume: str = ""
    """Run directory of an interrupted run to continue from its newest complete checkpoint."""
    seed: int = 0
    """Seed for prompt order and sampling."""
    threads: int = 2
    """Torch CPU threads (0 = one per core)."""
    steps: int = 250
    """Optimizer steps (one rollout batch each, times num_iterations x num_minibatches updates)."""
    prompts_per_step: int = 8
    """Distinct prompts per rollout batch."""
    group_size: int = 8
    """Completions sampled per prompt (G)."""
    prompt_pool: int = 20_000
    """Training prompts drawn from the task's training split; iterated in a shuffled order."""
    temperature: float = 1.0
    """Sampling temperature; log-probs in the loss use the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling threshold (1 = off)."""
    top_k: int = 0
    """Top-k sampling (0 = off)."""
    max_new_tokens: int = 12
    """Token budget of one trajectory after its prompt (model, template and tool-output tokens); for a single-turn task, the completion limit. A task may set its own (calculator: 48), which this option overrides; the run's first line says the budget it uses."""
    max_turns: int = 0
    """Model turns per episode (0 = the task's own: 1 for single-turn tasks)."""
    max_turn_tokens: int = 0
    """Cap on one model turn, within the budget (0 = the task's own, else the budget)."""
    max_parse_errors: int = 3
    """Malformed turns (bad tool-call syntax, unknown tool, bad arguments) an episode may make; each goes back to the model as an error observation."""
    termination_policy: str = ""
    """What training does with an episode by why it ended, on top of the defaults (multi-turn length-type endings masked — single-turn ones follow `overlong` —, tool_timeout/env_error excluded, the rest trained): e.g. `max_turns=penalise,turn_length=train`; actions train, mask, penalise, exclude."""
    termination_penalty: float = 1.0
    """Subtracted from the reward of an episode whose ending the policy says to penalise."""
    mask_observations: bool = True
    """Keep tool output and template tokens out of the loss (as they must be); False is an ablation that trains on them as if the model had written them."""
    save_trajectories: int = 4
    """Trajectories written to trajectories.jsonl each step (and from each evaluation), for people to read (0 = none)."""
    missing_eos_penalty: float = 0.0
    """Subtracted from the reward of a completion that hit max_new_tokens without EOS (TRL's missing_eos_penalty); a reward model never saw such text, so its score there is not to be trusted."""
    advantage: str = "grpo"
    """Advantage estimator: per sequence grpo, dr_grpo, rloo; per token gae (needs a critic), reinforce_pp."""
    std: Literal["sample", "population"] = "sample"
    """grpo: normalise by the sample (n-1) or population (n) standard deviation."""
    scale: Literal["group", "batch", "none"] = "group"
    """grpo: divide by the group's std, the batch's std, or not at all."""
    advantage_eps: float = 1e-6
    """grpo: the eps of (R - mean) / (std + eps) (TRL's GRPO uses 1e-4, verl 1e-6)."""
    loss: str = "ppo_clip"
    """Policy loss: ppo_clip, gspo, gspo_token or cispo."""
    clip_eps_low: float = 0.2
    """Lower clip range of the ratio (1 - eps_low)."""
    clip_eps_high: float = 0.2
    """Upper clip range of the ratio (1 + eps_high); > eps_low is DAPO's clip-higher."""
    ratio_cap: float = 0.0
    """cispo: an absolute cap on the importance weight, min(r, ratio_cap), with no lower bound and possibly below 1, instead of the clip range (TRL's `epsilon_high` for its cispo loss; 0 = off)."""
    ratio_level: Literal["token", "sequence"] = "token"
    """cispo: the importance ratio per token, or per sequence (exp of the mean token log-ratio, as GSPO and TRL's `importance_sampling_level=sequence`)."""
    dual_clip: float = 0.0
    """Dual-clip constant c > 1 for negative advantages (0 = off)."""
    aggregation: str = "seq_mean_token_mean"
    """How token losses become one number: seq_mean_token_mean, token_mean or seq_mean_token_sum_norm."""
    max_len_norm: int = 0
    """The constant L_max of seq_mean_token_sum_norm (0 = max_new_tokens)."""
    beta: float = 0.0
    """KL coefficient toward the reference (0 = no reference model is held)."""
    kl_estimator: str = "k3"
    """KL estimator added to the loss: k1, k2, k3, or k3_ratio (k3 times the token ratio pi/pi_old, differentiable: TRL's `use_bias_correction_kl`); a reward penalty is always k1, so kl_placement=reward takes only k1."""
    kl_placement: Literal["loss", "reward"] = "loss"
    """Where beta*KL goes: a term of the loss (GRPO) or a per-token reward penalty (PPO-RLHF)."""
    target_kl: float = 0.0
    """Adapt beta toward this per-token KL (Ziegler et al. 2019); 0 = fixed beta."""
    kl_horizon: int = 10_000
    """Horizon, in samples, of the adaptive KL controller; more than 0.2 x prompts_per_step x group_size, else one step could turn beta negative."""
    gamma: float = 1.0
    """Discount of token-level returns (gae, reinforce_pp)."""
    gae_lambda: float = 0.95
    """GAE's lambda."""
    whiten_advantages: bool = False
    """Whiten advantages over the batch (PPO's usual choice); how: whiten_over, whiten_eps, whiten_std."""
    whiten_over: Literal["tokens", "sequences"] = "tokens"
    """Whitening statistics over the batch's loss tokens, (A - mean) / sqrt(var + eps), or over its sequences, one advantage each, (A - mean) / (std + eps) (TRL's RLOO normalize_advantages; per-sequence advantages only)."""
    whiten_eps: float = 1e-8
    """The eps of whitening (TRL's RLOO uses 1e-4 with sequences)."""
    whiten_std: Literal["population", "sample"] = "population"
    """Whitening's variance: population (n) or sample (n-1; torch's std, as TRL)."""
    critic: Literal["none", "head", "separate"] = "none"
    """Value model for gae: a value head on the policy's trunk, or a separate model initialised from `model`."""
    critic_lr: float = 5e-4
    """Peak learning rate of the critic's parameters."""
    vf_coef: float = 0.5
    """Weight of the value loss in the total loss."""
    clip_eps_value: float = 0.2
    """Value-loss clipping range around the rollout's values (0 = no clipping)."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient (subtracted from the loss)."""
    dynamic_sampling: bool = False
    """DAPO: keep sampling prompts and drop groups whose rewards are all equal until the batch is full."""
    max_sampling_rounds: int = 16
    """Dynamic sampling: rounds of prompts_per_step prompts before giving up with an error. Where few groups carry signal (28% at the embedded task's SFT start, measured), a batch needs about 1 / that share rounds: 4 gave out within the first steps there."""
    overlong: Literal["none", "mask", "penalty"] = "none"
    """Truncated completions: keep, mask out of the loss, or DAPO's soft length penalty."""
    overlong_cache: int = 4
    """Soft penalty ramp: completions longer than max_new_tokens - overlong_cache are penalised linearly."""
    num_iterations: int = 1
    """Passes (PPO epochs) over each rollout batch; > 1 makes the clip matter."""
    num_minibatches: int = 1
    """Optimizer steps per pass: the rollout batch is split into this many minibatches."""
    micro_batch_tokens: int = 0
    """Micro-batches by token budget instead of row count: rows of similar length packed while rows x longest (prompt + completion, padding trimmed) stays within this (0 = use micro_batch_size)."""
    micro_batch_size: int = 0
    """Sequences per forward/backward within a minibatch, with gradient accumulation (0 = whole minibatch)."""
    lr: float = 1e-4
    """Peak learning rate of AdamW."""
    warmup_steps: int = 10
    """Optimizer updates of linear warm-up."""
    lr_schedule: Schedule = "constant"
    """Decay after warm-up: cosine, linear or constant."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of the peak (cosine/linear)."""
    weight_decay: float = 0.0
    """AdamW weight decay (matrices only)."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 = off)."""
    eval_every: int = 50
    """Evaluate on held-out problems every this many steps (and at the end)."""
    keep_dropout: bool = False
    """Keep the model's dropout on in the loss forward; by default it is off in policy, reference and critic, so an on-policy step sees a ratio of exactly 1 and no KL."""
    eval_problems: int = 500
    """Held-out problems for greedy evaluation (0 = skip)."""
    select_problems: int = 200
    """With a stopping rule: held-out problems, after the `eval_problems` reported ones, on which the rule picks the best model, so that the reported accuracy is not the best of several evaluations of the same set (0 = pick on the reported set)."""
    eval_max_new_tokens: int = 12
    """Token limit for evaluation answers; for a multi-turn task, the budget of a whole episode (a task may set its own)."""
    save_every: int = 50
    """Write a resumable checkpoint every this many steps (0 = only the final model)."""
    keep_checkpoints: int = 2
    """Complete checkpoints to keep."""
    engine: str = "auto"
    """What samples the rollouts: auto, local or vllm. `local` is the built-in engine on the trainer's own model (its log-probs are the trainer's); `vllm` a colocated vLLM engine (needs CUDA and `pip install vllm`), synced after every update, probed, and corrected with truncated importance sampling; `auto` picks vllm when it is importable and a GPU is visible, else local."""
    tis_cap: float = 2.0
    """vllm engine: cap C of the truncated importance weight min(pi_trainer / pi_sampler, C) on each token's loss (Yao et al. 2025); 0 = no reweighting (pi_old is still the trainer's recomputed log-probs)."""
    probe_tolerance: float = 0.1
    """vllm engine: largest mean absolute log-prob difference, on a fixed probe sequence after each weight sync, between the engine and the trainer before the run stops as sampling from stale weights (bf16 engine vs fp32 trainer differ by about 1e-2; identical fp32 forwards by under 1e-5); 0 = no probe."""
    vllm_gpu_memory_utilization: float = 0.3
    """vllm engine: fraction of GPU memory vLLM may take (weights and KV cache); the rest is left to training, which shares the GPU."""
    ptx_coef: float = 0.0
    """PPO-ptx (InstructGPT, arXiv:2203.02155): every update adds ptx_coef x the mean token NLL of a batch of pre-training or SFT data to the loss, so that RL does not forget it (0 = off)."""
    ptx_data: str = ""
    """The ptx data, read like `lmpo train cpt/sft --data` (JSONL, JSON, CSV/TSV (every value text), Parquet (the text formats also .gz/.bz2/.xz) or a saved `datasets` directory (`DIR::split`)): `text` rows carry loss on every token (CPT), `prompt`/`completion` or `messages` rows on the completion (SFT); empty = the task's own CPT corpus."""
    ptx_batch_size: int = 8
    """Sequences of ptx data per update."""
    ptx_max_length: int = 1024
    """Longest ptx_data example, in tokens, or the model's context where that is shorter (a longer one is an error naming its row)."""
    ptx_documents: int = 20_000
    """Documents of the task's CPT corpus generated as the ptx data when ptx_data is empty."""

    def validate(self) -> None:
        """Fail before any model loads when the batch arithmetic cannot work."""
        raise_if_any("RL", self.problems(), self)

    def problems(self) -> list[str]:
        """Every value, or combination of values, that cannot work (what `validate` refuses)."""
        batch = self.prompts_per_step * self.group_size
        problems = literal_problems(self)
        if self.group_size < 2 and (self.advantage in ("grpo", "dr_grpo", "rloo") or self.dynamic_sampling):
            problems.append(f"group_size={self.group_size}: group-relative advantages need at least 2 completions per prompt")
        if self.num_minibatches < 1 or batch % self.num_minibatches:
            problems.append(f"num_minibatches={self.num_minibatches} must divide prompts_per_step x group_size = {batch}")
        elif self.micro_batch_size and self.micro_batch_tokens:
            problems.append("micro_batch_size and micro_batch_tokens both split minibatches; give one")
        elif self.micro_batch_size and (batch // self.num_minibatches) % self.micro_batch_size:
            problems.append(f"micro_batch_size={self.micro_batch_size} must divide the minibatch size {batch // self.num_minibatches}")
        if self.num_iterations < 1 or self.steps < 1:
            problems.append("steps and num_iterations must be >= 1")
        problems += name_problems(self)
        if self.advantage == "gae" and self.critic == "none":
            problems.append("advantage=gae needs a critic (critic=head or critic=separate)")
        if self.critic != "none" and self.advantage != "gae":
            problems.append(f"critic={self.critic} is only used by advantage=gae")
        if self.dynamic_sampling and self.max_sampling_rounds < 1:
            problems.append("max_sampling_rounds must be >= 1")
        if self.overlong == "penalty" and not 0 < self.overlong_cache <= self.max_new_tokens:
            problems.append(f"overlong_cache={self.overlong_cache} must be in 1..max_new_tokens={self.max_new_tokens}")
        problems += at_least(self, 0, "missing_eos_penalty", "beta", "target_kl")  # beta < 0 rewards leaving π_ref
        problems += at_least(self, 1, "kl_horizon") + kl_horizon_problems(self)
        problems += reward_problems(self) + optimizer_problems(self) + checkpoint_problems(self)
        problems += at_least(self, 1, "prompts_per_step", "eval_every", "max_new_tokens", "max_nonfinite_steps")
        problems += at_least(self, 0, "eval_problems", "select_problems", "max_unscorable_steps", "micro_batch_tokens")
        problems += at_least(self, 1, "reward_memory_mb") + stopping_problems(self) + guard_problems(self)
        if (self.stop_patience or self.max_minutes) and not self.eval_problems:
            problems.append("a stopping rule reads held-out accuracy: eval_problems must be > 0")
        problems += sampling_problems(self) + unused_option_problems(self) + data_option_problems(self)
        problems += at_least(self, 0, "max_turns", "max_turn_tokens", "save_trajectories", "termination_penalty")
        problems += at_least(self, 1, "max_parse_errors")
        try:
            from lmpo.trainers.termination import TerminationPolicy

            policy = TerminationPolicy.parse(self.termination_policy)
            if self.termination_penalty != type(self)().termination_penalty and \
                    "penalise" not in policy.actions_by_reason.values():
                problems.append(f"termination_penalty={self.termination_penalty} is what a 'penalise' ending costs, "
                                f"and termination_policy gives none (e.g. max_turns=penalise)")
        except ValueError as err:
            problems.append(str(err))
        problems += [f"{name}={getattr(self, name)} must be in [0, 1]" for name in ("gamma", "gae_lambda")
                     if not 0 <= getattr(self, name) <= 1]  # a discount and GAE's trace decay
        if self.dual_clip and self.dual_clip <= 1:
            problems.append(f"dual_clip={self.dual_clip} must be > 1 (or 0 = off)")
        return problems + engine_problems(self) + ptx_problems(self)


ENGINES = ("auto", "local", "vllm")


def name_problems(cfg: RLConfig) -> list[str]:
    """`advantage`, `loss`, `aggregation` and `kl_estimator` that name no registered function: said
    here, so that a pipeline refuses a misspelt one before its first stage runs, not when RL starts."""
    from lmpo.algos import ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES, TOKEN_ADVANTAGES
    from lmpo.names import did_you_mean

    known = {"advantage": ADVANTAGES.names() + TOKEN_ADVANTAGES.names(), "loss": POLICY_LOSSES.names(),
             "aggregation": AGGREGATIONS.names(), "kl_estimator": KL_ESTIMATORS.names()}
    problems = []
    for option, names in known.items():
        value = getattr(cfg, option)
        if value not in names:
            problems.append(f"{option}={value!r}{did_you_mean(str(value), names)} is not one of {', '.join(names)}")
    return problems


def smallest_kl_horizon(samples: int) -> int:
    """The smallest horizon for which the adaptive KL controller, updated after `samples` samples,
    keeps beta > 0: its factor 1 - KL_ERROR_CLIP x samples / horizon (KL far below target) > 0."""
    from lmpo.algos.kl_control import KL_ERROR_CLIP

    horizon = max(1, int(KL_ERROR_CLIP * samples))
    while 1.0 - KL_ERROR_CLIP * samples / horizon <= 0:
        horizon += 1
    return horizon


def kl_horizon_problems(cfg: RLConfig) -> list[str]:
    """`kl_horizon` too short for one step's samples: beta would turn 0 or negative (rewarding
    distance from the reference) at the first step whose KL is well below target_kl."""
    from lmpo.algos.kl_control import KL_ERROR_CLIP

    samples = cfg.prompts_per_step * cfg.group_size
    smallest = smallest_kl_horizon(samples)
    if not cfg.target_kl > 0 or cfg.kl_horizon < 1 or cfg.kl_horizon >= smallest:
        return []
    return [f"kl_horizon={cfg.kl_horizon} is too short for {samples} samples per step (prompts_per_step x "
            f"group_size): the adaptive KL controller multiplies beta by 1 - {KL_ERROR_CLIP:g} x "
            f"{samples}/{cfg.kl_horizon} when the KL is below target_kl, which is <= 0 (beta would reward leaving "
            f"the reference); --kl_horizon must be >= {smallest} (Ziegler et al. use 10000)"]


def ptx_problems(cfg: RLConfig) -> list[str]:
    """`ptx_coef` and the options only it reads."""
    problems = at_least(cfg, 0, "ptx_coef") + at_least(cfg, 1, "ptx_batch_size", "ptx_max_length", "ptx_documents")
    defaults = RLConfig()
    changed = [n for n in ("ptx_data", "ptx_batch_size", "ptx_max_length", "ptx_documents")
               if getattr(cfg, n) != getattr(defaults, n)]
    if changed and not cfg.ptx_coef:
        problems.append(f"{', '.join(changed)} only read with ptx_coef > 0")
    if cfg.ptx_data and cfg.ptx_documents != defaults.ptx_documents:
        problems.append(f"ptx_documents={cfg.ptx_documents} is not used with ptx_data (the file's rows are)")
    if not cfg.ptx_data and cfg.ptx_max_length != defaults.ptx_max_length:
        problems.append(f"ptx_max_length={cfg.ptx_max_length} is only read with ptx_data")
    return problems


def engine_problems(cfg: RLConfig) -> list[str]:
    """`engine`, `tis_cap`, `probe_tolerance` and `vllm_gpu_memory_utilization`."""
    problems = []
    if cfg.engine not in ENGINES:
        problems.append(f"engine={cfg.engine!r} must be one of {', '.join(ENGINES)}")
    if cfg.tis_cap and not cfg.tis_cap >= 1:
        problems.append(f"tis_cap={cfg.tis_cap} must be >= 1 (a cap below 1 down-weights every token), or 0 = off")
    if not cfg.probe_tolerance >= 0:
        problems.append(f"probe_tolerance={cfg.probe_tolerance} must be >= 0 (0 = no probe)")
    if not 0 < cfg.vllm_gpu_memory_utilization < 1:
        problems.append(f"vllm_gpu_memory_utilization={cfg.vllm_gpu_memory_utilization} must be in (0, 1): "
                        f"the rest of the GPU is the trainer's")
    return problems
