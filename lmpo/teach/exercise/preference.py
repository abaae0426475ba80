"""Exercises on pairwise preference losses: DPO, and the Bradley–Terry reward-model loss."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from lmpo.algos import PREFERENCE_LOSSES, bradley_terry_loss
from lmpo.teach.exercise.core import Case, Exercise, Probe
from lmpo.teach.exercise.explain import always, by_variants, fixed
from lmpo.teach.exercise.plug import Plug, keywords_taken
from lmpo.teach.exercise.ppo import first


def pairs_case(label: str, chosen: list, rejected: list, ref_chosen: list, ref_rejected: list,
               beta: float = 0.1, dtype=torch.float32) -> Case:
    t = lambda x: torch.as_tensor(x).to(dtype).clone()  # noqa: E731
    return Case(label, {"chosen_logps": t(chosen), "rejected_logps": t(rejected), "ref_chosen_logps": t(ref_chosen),
                        "ref_rejected_logps": t(ref_rejected)}, {"beta": beta})


def random_pairs(gen: torch.Generator) -> Case:
    n = int(torch.randint(1, 7, (), generator=gen))
    draw = lambda: -torch.rand(n, generator=gen) * 30 - 1  # noqa: E731  (sums of token log-probs)
    beta = float(torch.rand((), generator=gen)) * 0.9 + 0.05
    return Case(f"{n} random pairs, beta={beta:.3f}", {"chosen_logps": draw(), "rejected_logps": draw(),
                                                        "ref_chosen_logps": draw(), "ref_rejected_logps": draw()},
                {"beta": beta})


def _h(c: Case) -> Tensor:
    a = c.args
    return c.options["beta"] * ((a["chosen_logps"] - a["ref_chosen_logps"]) - (a["rejected_logps"] - a["ref_rejected_logps"]))


DPO_VARIANTS = (
    (lambda c: -F.logsigmoid(-_h(c)),
     fixed("the chosen and rejected answers are swapped (wrong sign of h): the loss decreases when the rejected "
           "answer becomes more likely; h = β·[(π_w − ref_w) − (π_l − ref_l)]")),
    (lambda c: -F.logsigmoid(_h(c) / c.options["beta"]),
     fixed("β is missing: h = β·[(π_w − ref_w) − (π_l − ref_l)] goes inside the sigmoid")),
    (lambda c: -c.options["beta"] * F.logsigmoid(_h(c) / c.options["beta"]),
     fixed("β multiplies the loss instead of the log-ratio difference inside the sigmoid")),
    (lambda c: -F.logsigmoid(c.options["beta"] * (c.args["chosen_logps"] - c.args["rejected_logps"])),
     fixed("the reference log-probs are not subtracted: DPO's implicit reward is β·(log π_θ − log π_ref)")),
    (lambda c: F.logsigmoid(_h(c)), fixed("your loss has the wrong sign: it is −log σ(h), minimised by a large h")),
)
OVERFLOW = ("−log(sigmoid(h)) overflows for a very negative h: sigmoid(−200) underflows to 0 and log(0) = −inf; the "
            "loss there is ≈ −h (here 200). Use F.logsigmoid(h) (or softplus(−h)), finite for every h")

DPO_DOC = {
    "en": """DPO (Rafailov et al. 2023, arXiv:2305.18290), one loss per pair.

    h = β·[(log π_θ(y_w) − log π_ref(y_w)) − (log π_θ(y_l) − log π_ref(y_l))]
    loss = −log σ(h)

    chosen_logps, rejected_logps:         [B] log π_θ of the chosen (y_w) and rejected (y_l)
                                          answers, SUMMED over their completion tokens
                                          (the caller masked prompt and padding).
    ref_chosen_logps, ref_rejected_logps: [B] the same under the frozen reference π_ref:
                                          constants (no gradient may reach them).
    beta:                                 β, the strength of the implicit KL (0.1).
    returns:                              [B] the loss of each pair (the trainer takes the mean).

    lmpo's `dpo` (`lmpo.algos.PREFERENCE_LOSSES.get("dpo")`) returns (loss, figures) and
    computes −log σ(h) as −logsigmoid(h), finite for any h; returning the loss is enough here.""",
    "zh": """DPO（Rafailov 等 2023，arXiv:2305.18290），每个偏好对一个损失。

    h = β·[(log π_θ(y_w) − log π_ref(y_w)) − (log π_θ(y_l) − log π_ref(y_l))]
    loss = −log σ(h)

    chosen_logps, rejected_logps:         [B] 被选回答 (y_w) 与被拒回答 (y_l) 在 π_θ 下的
                                          log 概率，对补全 token 求和（调用方已去掉提示和 padding）。
    ref_chosen_logps, ref_rejected_logps: [B] 同样的量在冻结参考模型 π_ref 下的值：
                                          常数（梯度不能流到它们）。
    beta:                                 β，隐式 KL 的强度（0.1）。
    返回:                                 [B] 每个偏好对的损失（训练器取平均）。

    lmpo 的 `dpo`（`lmpo.algos.PREFERENCE_LOSSES.get("dpo")`）返回 (loss, figures)，
    并用 −logsigmoid(h) 计算 −log σ(h)，对任何 h 都有限；这里只返回 loss 即可。""",
}

BASIC_PAIRS = pairs_case("3 pairs, beta=0.1", [-12.0, -30.0, -5.0], [-15.0, -20.0, -5.5], [-13.0, -28.0, -6.0],
                         [-14.0, -21.0, -5.0])


def _figures(chosen_reward: Tensor, rejected_reward: Tensor) -> dict[str, Tensor]:
    margin = (chosen_reward - rejected_reward).detach()
    return {"chosen_reward": chosen_reward.detach(), "rejected_reward": rejected_reward.detach(), "margin": margin,
            "accuracy": (margin > 0).to(margin.dtype)}


def wrap_dpo(fn: Callable) -> Callable:
    """The user's DPO loss with the preference registry's convention, ``(loss [B], figures)``."""

    def dpo_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, *, beta=0.1,
                 chosen_lengths=None, rejected_lengths=None):
        loss = first(fn(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps,
                        **keywords_taken(fn, {"beta": beta})))
        return loss, _figures(beta * (chosen_logps - ref_chosen_logps), beta * (rejected_logps - ref_rejected_logps))

    return dpo_loss


DPO = Exercise(
    name="dpo_loss",
    summary="DPO's −log σ(β·[(π_w − ref_w) − (π_l − ref_l)]) per pair",
    function="dpo_loss",
    signature=("def dpo_loss(chosen_logps: Tensor, rejected_logps: Tensor, ref_chosen_logps: Tensor,\n"
               "             ref_rejected_logps: Tensor, beta: float = 0.1) -> Tensor:"),
    reference=PREFERENCE_LOSSES.get("dpo"),
    reference_label='lmpo.algos.PREFERENCE_LOSSES.get("dpo") (its per-pair loss)',
    doc=DPO_DOC,
    random_case=random_pairs,
    project=first,
    probes=(
        Probe("pairs", "three pairs, beta=0.1", lambda: [BASIC_PAIRS], by_variants(*DPO_VARIANTS)),
        Probe("beta", "beta=0.5 and beta=2", lambda: [pairs_case(f"the same pairs, beta={b}",
                                                                 *BASIC_PAIRS.args.values(), beta=b)
                                                      for b in (0.5, 2.0)], by_variants(*DPO_VARIANTS)),
        Probe("extreme", "a very negative h gives a finite loss ≈ −h",
              lambda: [pairs_case("h = −200 and +200 (beta=1)", [-300.0, -10.0], [-100.0, -210.0], [0.0, 0.0],
                                  [0.0, 0.0], beta=1.0)], by_variants(*DPO_VARIANTS, fallback=always(OVERFLOW))),
        Probe("gradient", "gradient reaches the policy's log-probs and not the reference's",
              lambda: [BASIC_PAIRS], by_variants(*DPO_VARIANTS),
              grad=("chosen_logps", "rejected_logps", "ref_chosen_logps", "ref_rejected_logps"),
              grad_messages={name: "gradient flows through the reference log-probs (missing stop-gradient / "
                                   "detach): π_ref is frozen, its log-probs are constants of the loss"
                             for name in ("ref_chosen_logps", "ref_rejected_logps")}),
        Probe("float64", "float64 in, float64 out",
              lambda: [pairs_case("float64 pairs", [-3.0], [-4.0], [-3.5], [-3.5], dtype=torch.float64)]),
    ),
    plug=Plug("dpo", PREFERENCE_LOSSES, "loss", "dpo", {}, "the DPO stage's loss", wrap=wrap_dpo),
)


def bt_case(label: str, chosen: list, rejected: list, margin=0.0, dtype=torch.float32) -> Case:
    t = lambda x: torch.tensor(x, dtype=dtype)  # noqa: E731
    return Case(label, {"chosen_scores": t(chosen), "rejected_scores": t(rejected)},
                {"margin": t(margin) if isinstance(margin, list) else margin})


def random_scores(gen: torch.Generator) -> Case:
    n = int(torch.randint(1, 7, (), generator=gen))
    margin = float(torch.rand((), generator=gen)) * 2
    return Case(f"{n} random score pairs, margin={margin:.3f}",
                {"chosen_scores": torch.randn(n, generator=gen) * 3, "rejected_scores": torch.randn(n, generator=gen) * 3},
                {"margin": margin})


def _d(c: Case) -> Tensor:
    return c.args["chosen_scores"] - c.args["rejected_scores"]


BT_VARIANTS = (
    (lambda c: -F.logsigmoid(-_d(c) - c.options["margin"]),
     fixed("chosen and rejected are swapped (wrong sign): the loss decreases when the rejected answer scores "
           "higher; the loss is −log σ(r_w − r_l − m)")),
    (lambda c: -F.logsigmoid(_d(c) + c.options["margin"]),
     fixed("the margin is added instead of subtracted: with m > 0 the chosen score must beat the rejected one BY m, "
           "so the loss is −log σ(r_w − r_l − m); yours makes the task easier, not harder")),
    (lambda c: -F.logsigmoid(_d(c)), fixed("the margin is ignored: the loss is −log σ(r_w − r_l − m)")),
    (lambda c: F.logsigmoid(_d(c) - c.options["margin"]), fixed("your loss has the wrong sign: it is −log σ(…)")),
)

BT_OVERFLOW = ("−log(sigmoid(x)) overflows for a very negative x = r_w − r_l − m: sigmoid(−200) underflows to 0 and "
               "log(0) = −inf; the loss there is ≈ −x (here 200). Use F.logsigmoid(x) (or softplus(−x))")

BT_DOC = {
    "en": """The Bradley–Terry reward-model loss, one per pair (InstructGPT, Ouyang et al. 2022,
    arXiv:2203.02155; the margin as in Llama 2, arXiv:2307.09288).

    loss = −log σ(r_w − r_l − m)

    chosen_scores:   [B] the reward model's score r_w of each chosen answer.
    rejected_scores: [B] the score r_l of each rejected answer.
    margin:          m, a float or a [B] tensor (a constant: no gradient); 0 by default.
    returns:         [B] the loss of each pair.

    lmpo's `bradley_terry_loss` (`lmpo.algos.bradley_terry_loss`) returns (loss, figures) and
    also has a centering term c·(r_w + r_l)² (off by default); returning the loss is enough here.
    Compute −log σ(x) as −logsigmoid(x): it must stay finite for x = −200.""",
    "zh": """Bradley–Terry 奖励模型损失，每个偏好对一个（InstructGPT，Ouyang 等 2022，
    arXiv:2203.02155；margin 的用法同 Llama 2，arXiv:2307.09288）。

    loss = −log σ(r_w − r_l − m)

    chosen_scores:   [B] 奖励模型对每个被选回答的打分 r_w。
    rejected_scores: [B] 对每个被拒回答的打分 r_l。
    margin:          m，浮点数或 [B] 张量（常数：无梯度）；默认为 0。
    返回:            [B] 每个偏好对的损失。

    lmpo 的 `bradley_terry_loss`（`lmpo.algos.bradley_terry_loss`）返回 (loss, figures)，
    另有居中项 c·(r_w + r_l)²（默认关闭）；这里只返回 loss 即可。
    用 −logsigmoid(x) 计算 −log σ(x)：x = −200 时也必须有限。""",
}


def wrap_bt(fn: Callable) -> Callable:
    """A DPO-stage loss that is Bradley–Terry on DPO's implicit rewards β·(log π_θ − log π_ref): with the
    correct BT loss it is exactly DPO (Rafailov et al. 2023 derive DPO this way)."""

    def bt_on_implicit_rewards(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, *, beta=0.1,
                               chosen_lengths=None, rejected_lengths=None):
        chosen_reward = beta * (chosen_logps - ref_chosen_logps.detach())
        rejected_reward = beta * (rejected_logps - ref_rejected_logps.detach())
        return first(fn(chosen_reward, rejected_reward)), _figures(chosen_reward, rejected_reward)

    return bt_on_implicit_rewards


BRADLEY_TERRY = Exercise(
    name="bradley_terry_loss",
    summary="the reward model's Bradley–Terry loss −log σ(r_w − r_l − m) per pair",
    function="bradley_terry_loss",
    signature=("def bradley_terry_loss(chosen_scores: Tensor, rejected_scores: Tensor,\n"
               "                       margin: float | Tensor = 0.0) -> Tensor:"),
    reference=bradley_terry_loss,
    reference_label="lmpo.algos.bradley_terry_loss (its per-pair loss; center_coef=0)",
    doc=BT_DOC,
    random_case=random_scores,
    project=first,
    probes=(
        Probe("pairs", "four pairs, no margin",
              lambda: [bt_case("scores (2, 0.5), (-1, 1), (0, 0), (3, -2)", [2.0, -1.0, 0.0, 3.0],
                               [0.5, 1.0, 0.0, -2.0])], by_variants(*BT_VARIANTS)),
        Probe("margin", "the margin is subtracted (float and per-pair tensor)",
              lambda: [bt_case("the same pairs, margin=1.0", [2.0, -1.0, 0.0, 3.0], [0.5, 1.0, 0.0, -2.0], 1.0),
                       bt_case("per-pair margins [0, 0.5, 1, 2]", [2.0, -1.0, 0.0, 3.0], [0.5, 1.0, 0.0, -2.0],
                               [0.0, 0.5, 1.0, 2.0])], by_variants(*BT_VARIANTS)),
        Probe("extreme", "a very negative difference gives a finite loss",
              lambda: [bt_case("r_w − r_l = −200 and +200", [-100.0, 100.0], [100.0, -100.0])],
              by_variants(*BT_VARIANTS, fallback=always(BT_OVERFLOW))),
        Probe("gradient", "gradient reaches both scores, not the margin",
              lambda: [bt_case("margins [0, 0.5, 1, 2]", [2.0, -1.0, 0.0, 3.0], [0.5, 1.0, 0.0, -2.0],
                               [0.0, 0.5, 1.0, 2.0])], by_variants(*BT_VARIANTS),
              grad=("chosen_scores", "rejected_scores", "margin"),
              grad_messages={"margin": "gradient flows through the margin (missing stop-gradient / detach): m is a "
                                       "fixed target gap, not something to learn"}),
        Probe("float64", "float64 in, float64 out",
              lambda: [bt_case("float64 scores", [1.0], [0.25], dtype=torch.float64)]),
    ),
    plug=Plug("dpo", PREFERENCE_LOSSES, "loss", "dpo", {},
              "the DPO stage's loss, as Bradley–Terry on DPO's implicit rewards β·(log π_θ − log π_ref) (the "
              "reference run is lmpo's DPO, which is exactly that)", wrap=wrap_bt),
)
