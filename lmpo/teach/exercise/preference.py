"""Exercises on pairwise preference losses: DPO, and the Bradley–Terry reward-model loss."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from lmpo.algos import PREFERENCE_LOSSES, bradley_terry_loss
from lmpo.teach.exercise.core import Case, Exercise, Probe
from lmpo.teach.exercise.explain import always, by_variants, fixed
from lmpo.teach.exercise.lang import Text, both
from lmpo.teach.exercise.plug import Plug, keywords_taken
from lmpo.teach.exercise.ppo import first


def pairs_case(label: Text, chosen: list, rejected: list, ref_chosen: list, ref_rejected: list,
               beta: float = 0.1, dtype=torch.float32) -> Case:
    t = lambda x: torch.as_tensor(x).to(dtype).clone()  # noqa: E731
    return Case(label, {"chosen_logps": t(chosen), "rejected_logps": t(rejected), "ref_chosen_logps": t(ref_chosen),
                        "ref_rejected_logps": t(ref_rejected)}, {"beta": beta})


def random_pairs(gen: torch.Generator) -> Case:
    n = int(torch.randint(1, 7, (), generator=gen))
    draw = lambda: -torch.rand(n, generator=gen) * 30 - 1  # noqa: E731  (sums of token log-probs)
    beta = float(torch.rand((), generator=gen)) * 0.9 + 0.05
    return Case(both(f"{n} random pairs, beta={beta:.3f}", f"{n} 个随机偏好对，beta={beta:.3f}"), {"chosen_logps": draw(), "rejected_logps": draw(),
                                                        "ref_chosen_logps": draw(), "ref_rejected_logps": draw()},
                {"beta": beta})


def _h(c: Case) -> Tensor:
    a = c.args
    return c.options["beta"] * ((a["chosen_logps"] - a["ref_chosen_logps"]) - (a["rejected_logps"] - a["ref_rejected_logps"]))


def _h_ref_added(c: Case) -> Tensor:
    a = c.args
    return c.options["beta"] * ((a["chosen_logps"] + a["ref_chosen_logps"]) - (a["rejected_logps"] + a["ref_rejected_logps"]))


DPO_VARIANTS = (
    (lambda c: -F.logsigmoid(-_h(c)),
     fixed(both("the chosen and rejected answers are swapped (wrong sign of h): the loss decreases when the rejected "
                "answer becomes more likely; h = β·[(π_w − ref_w) − (π_l − ref_l)]",
                "被选回答和被拒回答弄反了（h 的符号反了）：被拒回答的概率变大时损失反而下降；"
                "h = β·[(π_w − ref_w) − (π_l − ref_l)]"))),
    (lambda c: -F.logsigmoid(_h(c) / c.options["beta"]),
     fixed(both("β is missing: h = β·[(π_w − ref_w) − (π_l − ref_l)] goes inside the sigmoid",
                "缺少 β：h = β·[(π_w − ref_w) − (π_l − ref_l)]，β 应放在 sigmoid 里面"))),
    (lambda c: -c.options["beta"] * F.logsigmoid(_h(c) / c.options["beta"]),
     fixed(both("β multiplies the loss instead of the log-ratio difference inside the sigmoid",
                "β 乘在了整个损失上，而不是乘在 sigmoid 里面的对数比之差上"))),
    (lambda c: -F.logsigmoid(c.options["beta"] * (c.args["chosen_logps"] - c.args["rejected_logps"])),
     fixed(both("the reference log-probs are not subtracted: DPO's implicit reward is β·(log π_θ − log π_ref)",
                "没有减去参考模型的 log 概率：DPO 的隐式奖励是 β·(log π_θ − log π_ref)"))),
    (lambda c: -F.logsigmoid(_h_ref_added(c)),
     fixed(both("the reference log-probs are added instead of subtracted: DPO's implicit reward is the log-RATIO "
                "β·(log π_θ − log π_ref), so h = β·[(π_w − ref_w) − (π_l − ref_l)]",
                "参考模型的 log 概率被加上而不是减去：DPO 的隐式奖励是对数比 β·(log π_θ − log π_ref)，"
                "所以 h = β·[(π_w − ref_w) − (π_l − ref_l)]"))),
    (lambda c: F.logsigmoid(_h(c)), fixed(both("your loss has the wrong sign: it is −log σ(h), minimised by a large h",
                                               "你的损失符号反了：应为 −log σ(h)，h 越大损失越小"))),
)
OVERFLOW = both("−log(sigmoid(h)) overflows for a very negative h: sigmoid(−200) underflows to 0 and log(0) = −inf; "
                "the loss there is ≈ −h (here 200). Use F.logsigmoid(h) (or softplus(−h)), finite for every h",
                "h 非常负时 −log(sigmoid(h)) 会溢出：sigmoid(−200) 下溢为 0，log(0) = −inf；此处的损失 ≈ −h"
                "（这里是 200）。请用 F.logsigmoid(h)（或 softplus(−h)），它对任何 h 都是有限值")

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
                                          log 概率，对回答词元求和（调用方已去掉提示和 padding）。
    ref_chosen_logps, ref_rejected_logps: [B] 同样的量在冻结参考模型 π_ref 下的值：
                                          常数（梯度不能流到它们）。
    beta:                                 β，隐式 KL 的强度（0.1）。
    返回:                                 [B] 每个偏好对的损失（训练器取平均）。

    lmpo 的 `dpo`（`lmpo.algos.PREFERENCE_LOSSES.get("dpo")`）返回 (loss, figures)，
    并用 −logsigmoid(h) 计算 −log σ(h)，对任何 h 都有限；这里只返回 loss 即可。""",
}

BASIC_PAIRS = pairs_case(both("3 pairs, beta=0.1", "3 个偏好对，beta=0.1"), [-12.0, -30.0, -5.0], [-15.0, -20.0, -5.5], [-13.0, -28.0, -6.0],
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
    summary=both("DPO's −log σ(β·[(π_w − ref_w) − (π_l − ref_l)]) per pair",
                 "DPO 损失 −log σ(β·[(π_w − ref_w) − (π_l − ref_l)])，每个偏好对一个"),
    function="dpo_loss",
    signature=("def dpo_loss(chosen_logps: Tensor, rejected_logps: Tensor, ref_chosen_logps: Tensor,\n"
               "             ref_rejected_logps: Tensor, beta: float = 0.1) -> Tensor:"),
    reference=PREFERENCE_LOSSES.get("dpo"),
    reference_label=both('lmpo.algos.PREFERENCE_LOSSES.get("dpo") (its per-pair loss)',
                         'lmpo.algos.PREFERENCE_LOSSES.get("dpo")（取其逐对损失）'),
    doc=DPO_DOC,
    random_case=random_pairs,
    project=first,
    probes=(
        Probe("pairs", both("three pairs, beta=0.1", "三个偏好对，beta=0.1"), lambda: [BASIC_PAIRS],
              by_variants(*DPO_VARIANTS)),
        Probe("beta", both("beta=0.5 and beta=2", "beta=0.5 和 beta=2"),
              lambda: [pairs_case(both(f"the same pairs, beta={b}", f"同样的偏好对，beta={b}"),
                                  *BASIC_PAIRS.args.values(), beta=b) for b in (0.5, 2.0)],
              by_variants(*DPO_VARIANTS)),
        Probe("extreme", both("a very negative h gives a finite loss ≈ −h", "h 非常负时损失仍然有限，≈ −h"),
              lambda: [pairs_case(both("h = −200 and +200 (beta=1)", "h = −200 和 +200（beta=1）"), [-300.0, -10.0], [-100.0, -210.0], [0.0, 0.0],
                                  [0.0, 0.0], beta=1.0)], by_variants(*DPO_VARIANTS, fallback=always(OVERFLOW))),
        Probe("gradient", both("gradient reaches the policy's log-probs and not the reference's",
                               "梯度传到策略的 log 概率，不传到参考模型的 log 概率"),
              lambda: [BASIC_PAIRS], by_variants(*DPO_VARIANTS),
              grad=("chosen_logps", "rejected_logps", "ref_chosen_logps", "ref_rejected_logps"),
              grad_messages={name: both("gradient flows through the reference log-probs (missing stop-gradient / "
                                        "detach): π_ref is frozen, its log-probs are constants of the loss",
                                        "梯度流过了参考模型的 log 概率（缺少 stop-gradient / detach）：π_ref 是冻结的，"
                                        "它的 log 概率是损失中的常数")
                             for name in ("ref_chosen_logps", "ref_rejected_logps")}),
        Probe("float64", both("float64 in, float64 out", "输入 float64，输出 float64"),
              lambda: [pairs_case(both("float64 pairs", "float64 偏好对"), [-3.0], [-4.0], [-3.5], [-3.5], dtype=torch.float64)]),
    ),
    plug=Plug("dpo", PREFERENCE_LOSSES, "loss", "dpo", {}, both("the DPO stage's loss", "DPO 阶段的损失"), wrap=wrap_dpo),
)


def bt_case(label: Text, chosen: list, rejected: list, margin=0.0, dtype=torch.float32) -> Case:
    t = lambda x: torch.tensor(x, dtype=dtype)  # noqa: E731
    return Case(label, {"chosen_scores": t(chosen), "rejected_scores": t(rejected)},
                {"margin": t(margin) if isinstance(margin, list) else margin})


def random_scores(gen: torch.Generator) -> Case:
    n = int(torch.randint(1, 7, (), generator=gen))
    margin = float(torch.rand((), generator=gen)) * 2
    return Case(both(f"{n} random score pairs, margin={margin:.3f}", f"{n} 对随机打分，margin={margin:.3f}"),
                {"chosen_scores": torch.randn(n, generator=gen) * 3, "rejected_scores": torch.randn(n, generator=gen) * 3},
                {"margin": margin})


def _d(c: Case) -> Tensor:
    return c.args["chosen_scores"] - c.args["rejected_scores"]


BT_VARIANTS = (
    (lambda c: -F.logsigmoid(-_d(c) - c.options["margin"]),
     fixed(both("chosen and rejected are swapped (wrong sign): the loss decreases when the rejected answer scores "
                "higher; the loss is −log σ(r_w − r_l − m)",
                "被选和被拒弄反了（符号反了）：被拒回答得分更高时损失反而下降；损失应为 −log σ(r_w − r_l − m)"))),
    (lambda c: -F.logsigmoid(_d(c) + c.options["margin"]),
     fixed(both("the margin is added instead of subtracted: with m > 0 the chosen score must beat the rejected one BY "
                "m, so the loss is −log σ(r_w − r_l − m); yours makes the task easier, not harder",
                "margin 被加上而不是减去：m > 0 时被选回答的得分必须比被拒回答高出 m，所以损失是 "
                "−log σ(r_w − r_l − m)；你的写法让任务变容易了，而不是更难"))),
    (lambda c: -F.logsigmoid(_d(c)), fixed(both("the margin is ignored: the loss is −log σ(r_w − r_l − m)",
                                                "忽略了 margin：损失应为 −log σ(r_w − r_l − m)"))),
    (lambda c: F.logsigmoid(_d(c) - c.options["margin"]), fixed(both("your loss has the wrong sign: it is −log σ(…)",
                                                                     "你的损失符号反了：应为 −log σ(…)"))),
)

BT_OVERFLOW = both("−log(sigmoid(x)) overflows for a very negative x = r_w − r_l − m: sigmoid(−200) underflows to 0 "
                   "and log(0) = −inf; the loss there is ≈ −x (here 200). Use F.logsigmoid(x) (or softplus(−x))",
                   "x = r_w − r_l − m 非常负时 −log(sigmoid(x)) 会溢出：sigmoid(−200) 下溢为 0，log(0) = −inf；"
                   "此处的损失 ≈ −x（这里是 200）。请用 F.logsigmoid(x)（或 softplus(−x)）")

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
    summary=both("the reward model's Bradley–Terry loss −log σ(r_w − r_l − m) per pair",
                 "奖励模型的 Bradley–Terry 损失 −log σ(r_w − r_l − m)，每个偏好对一个"),
    function="bradley_terry_loss",
    signature=("def bradley_terry_loss(chosen_scores: Tensor, rejected_scores: Tensor,\n"
               "                       margin: float | Tensor = 0.0) -> Tensor:"),
    reference=bradley_terry_loss,
    reference_label=both("lmpo.algos.bradley_terry_loss (its per-pair loss; center_coef=0)",
                         "lmpo.algos.bradley_terry_loss（取其逐对损失；center_coef=0）"),
    doc=BT_DOC,
    random_case=random_scores,
    project=first,
    probes=(
        Probe("pairs", both("four pairs, no margin", "四个偏好对，无 margin"),
              lambda: [bt_case(both("scores (2, 0.5), (-1, 1), (0, 0), (3, -2)", "打分 (2, 0.5), (-1, 1), (0, 0), (3, -2)"), [2.0, -1.0, 0.0, 3.0],
                               [0.5, 1.0, 0.0, -2.0])], by_variants(*BT_VARIANTS)),
        Probe("margin", both("the margin is subtracted (float and per-pair tensor)",
                             "margin 是被减去的（浮点数与逐对张量两种形式）"),
              lambda: [bt_case(both("the same pairs, margin=1.0", "同样的偏好对，margin=1.0"), [2.0, -1.0, 0.0, 3.0],
                               [0.5, 1.0, 0.0, -2.0], 1.0),
                       bt_case(both("per-pair margins [0, 0.5, 1, 2]", "逐对 margin [0, 0.5, 1, 2]"), [2.0, -1.0, 0.0, 3.0], [0.5, 1.0, 0.0, -2.0],
                               [0.0, 0.5, 1.0, 2.0])], by_variants(*BT_VARIANTS)),
        Probe("extreme", both("a very negative difference gives a finite loss", "差值非常负时损失仍然有限"),
              lambda: [bt_case(both("r_w − r_l = −200 and +200", "r_w − r_l = −200 和 +200"), [-100.0, 100.0], [100.0, -100.0])],
              by_variants(*BT_VARIANTS, fallback=always(BT_OVERFLOW))),
        Probe("gradient", both("gradient reaches both scores, not the margin", "梯度传到两个打分，不传到 margin"),
              lambda: [bt_case(both("margins [0, 0.5, 1, 2]", "margin 为 [0, 0.5, 1, 2]"), [2.0, -1.0, 0.0, 3.0], [0.5, 1.0, 0.0, -2.0],
                               [0.0, 0.5, 1.0, 2.0])], by_variants(*BT_VARIANTS),
              grad=("chosen_scores", "rejected_scores", "margin"),
              grad_messages={"margin": both("gradient flows through the margin (missing stop-gradient / detach): m "
                                            "is a fixed target gap, not something to learn",
                                            "梯度流过了 margin（缺少 stop-gradient / detach）：m 是固定的目标差距，"
                                            "不是要学习的量")}),
        Probe("float64", both("float64 in, float64 out", "输入 float64，输出 float64"),
              lambda: [bt_case(both("float64 scores", "float64 打分"), [1.0], [0.25], dtype=torch.float64)]),
    ),
    plug=Plug("dpo", PREFERENCE_LOSSES, "loss", "dpo", {},
              both("the DPO stage's loss, as Bradley–Terry on DPO's implicit rewards β·(log π_θ − log π_ref) (the "
                   "reference run is lmpo's DPO, which is exactly that)",
                   "DPO 阶段的损失：在 DPO 的隐式奖励 β·(log π_θ − log π_ref) 上计算 Bradley–Terry 损失（对照运行用 "
                   "lmpo 的 DPO，两者恰好等价）"), wrap=wrap_bt),
)
