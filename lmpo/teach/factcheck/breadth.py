"""Claim 20: RL with a verifier sharpens what the model samples rather than widening it (pass@k)."""

from __future__ import annotations

from pathlib import Path

import torch

from lmpo.teach.factcheck import plots
from lmpo.teach.factcheck.context import Context
from lmpo.teach.factcheck.core import DEPENDS, FAILS, HOLDS, Claim, Measured, Verdict
from lmpo.teach.factcheck.kl import BETAS
from lmpo.teach.factcheck.runs import rl_run

PROBLEMS = 200
"""Held-out problems each model samples."""
SAMPLES = 64
"""Samples per problem; pass@k for k = 1, 2, 4, ..., SAMPLES."""


def pass_at_k_curve(ctx: Context, model_dir: str) -> dict[int, float]:
    """pass@k of `model_dir` on the first `PROBLEMS` held-out problems, `SAMPLES` samples each at
    the RL stage's temperature and token budget, through lmpo's own evaluation."""
    from lmpo.envs import make_task
    from lmpo.models import load_model, load_tokenizer
    from lmpo.rollout import SamplingParams
    from lmpo.rollout.evaluation import evaluate

    cfg = ctx.stage("rl", "pass_at_k_probe", "grpo")
    task = make_task(cfg.task)
    tokenizer = load_tokenizer(model_dir)
    model = load_model(model_dir, tokenizer, seed=cfg.seed, keep_dropout=False).eval()
    sampling = SamplingParams(cfg.temperature, cfg.top_p, cfg.top_k, cfg.eval_max_new_tokens)
    result = evaluate(model, tokenizer, task, task.heldout_problems(PROBLEMS), sampling=sampling, samples=SAMPLES,
                      generator=torch.Generator().manual_seed(cfg.seed), n_examples=0)
    return result.pass_at


def _breadth(ctx: Context) -> Measured:
    start = ctx.start()
    trained = rl_run(ctx, f"grpo_beta{BETAS[0]:g}", beta=BETAS[0])
    models = {"base": str(Path(start.directory) / "cpt" / "model"), "sft": start.model_dir,
              "rl": str(trained.out / "model")}
    curves = {tag: pass_at_k_curve(ctx, model) for tag, model in models.items()}
    values: dict = {"problems": PROBLEMS, "samples": SAMPLES, "steps": len(trained.series("reward_mean"))}
    for tag, curve in curves.items():
        values.update({f"{tag}_pass{k}": v for k, v in curve.items()})
    ks = sorted(curves["rl"])
    values["base_ahead_from_k"] = next((k for k in ks if curves["base"][k] >= curves["rl"][k]), 0)  # 0: never
    fig, (ax,) = plots.figure(1, width=5.0)
    labels = {"base": "after CPT (base)", "sft": "after SFT (RL start)", "rl": "after GRPO"}
    plots.lines(ax, {labels[tag]: (ks, [curves[tag][k] for k in ks]) for tag in curves},
                f"pass@k on {PROBLEMS} held-out problems", "k (samples per problem)", "pass@k", marker="o")
    ax.set_xscale("log", base=2)
    return Measured(values, plots.png(fig))


def _judge_breadth(v: dict, limits: dict) -> Verdict:
    k = v["samples"]
    if v["rl_pass1"] - v["base_pass1"] <= limits["margin"]:
        return Verdict(DEPENDS, "no_sharpening")
    if v[f"rl_pass{k}"] - v[f"base_pass{k}"] > limits["margin"]:
        return Verdict(FAILS, "widened")
    if v[f"rl_pass{k}"] - v[f"sft_pass{k}"] > limits["margin"]:  # wider than its start, not than the base
        return Verdict(HOLDS, "sharpened")
    return Verdict(HOLDS, "sharpened_only")


BREADTH = Claim(
    name="rl_sharpens_not_widens", fast=False,
    papers=("Does Reinforcement Learning Really Incentivize Reasoning Capacity in LLMs Beyond the Base Model?, "
            "Yue et al. 2025, arXiv:2504.13837", "pass@k's unbiased estimator: Codex, Chen et al. 2021, arXiv:2107.03374"),
    text="RL with a verifiable reward sharpens, it does not widen: it makes right answers likelier (pass@1), but at "
         "large k the base model solves as many problems or more.",
    criterion="pass@k (k = 1 … 64, 64 samples per problem at temperature 1, the unbiased estimator) on 200 held-out "
              "problems, through lmpo's evaluation, of the base model (after CPT, before any post-training), the SFT "
              "model RL starts from, and a GRPO run from it (the pipeline's preset, β = 0). Holds if GRPO raises pass@1 "
              "over the base by more than {margin:.0%} while its pass@64 is at most {margin:.0%} above the base's; does "
              "not hold if its pass@64 is higher by more; depends if it does not raise pass@1.",
    summary="pass@1 / pass@64: base {base_pass1:.0%} / {base_pass64:.1%}; SFT {sft_pass1:.0%} / {sft_pass64:.1%}; "
            "GRPO {rl_pass1:.0%} / {rl_pass64:.1%}",
    notes={"sharpened": "GRPO lifted pass@1 from {base_pass1:.0%} (base) to {rl_pass1:.0%}, but not pass@64: there the "
                        "base model solves {base_pass64:.1%} of the problems, GRPO {rl_pass64:.1%}. "
                        "Which model counts as the base decides the answer: against its SFT start, whose demonstrations "
                        "narrowed the samples (pass@64 {sft_pass64:.1%}), GRPO widened them.",
           "sharpened_only": "GRPO lifted pass@1 from {base_pass1:.0%} (base) to {rl_pass1:.0%}, but not pass@64, "
                             "neither over the base ({base_pass64:.1%} against GRPO's {rl_pass64:.1%}) nor over its SFT "
                             "start ({sft_pass64:.1%}).",
           "widened": "GRPO's pass@64 ({rl_pass64:.1%}) is above the base model's ({base_pass64:.1%}): here RL reached "
                      "answers the base model did not sample in 64 tries.",
           "no_sharpening": "GRPO did not raise pass@1 over the base ({rl_pass1:.0%} against {base_pass1:.0%}): "
                            "nothing was sharpened to compare."},
    limits={"margin": 0.01},
    measure=_breadth, judge=_judge_breadth,
)

CLAIMS = [BREADTH]
