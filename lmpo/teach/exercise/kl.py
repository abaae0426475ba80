"""Exercise: the k3 estimator of KL(π_θ ‖ π_ref), GRPO's KL loss term."""

from __future__ import annotations

import torch
from torch import Tensor

from lmpo.algos import KL_ESTIMATORS
from lmpo.algos.kl import K3_KAPPA_CLAMP
from lmpo.teach.exercise.core import Case, Exercise, Probe
from lmpo.teach.exercise.explain import always, by_variants, fixed
from lmpo.teach.exercise.lang import Text, both
from lmpo.teach.exercise.plug import Plug


def kl_case(label: Text, logprobs: list, ref_logprobs: list, dtype=torch.float32) -> Case:
    return Case(label, {"logprobs": torch.tensor(logprobs, dtype=dtype),
                        "ref_logprobs": torch.tensor(ref_logprobs, dtype=dtype)})


def random_case(gen: torch.Generator) -> Case:
    rows, length = int(torch.randint(1, 4, (), generator=gen)), int(torch.randint(1, 8, (), generator=gen))
    logprobs = -torch.rand(rows, length, generator=gen) * 5
    ref = logprobs + torch.randn(rows, length, generator=gen)
    return Case(both(f"random log-probs [{rows}, {length}], log-ratios about ±1",
                     f"随机 log 概率 [{rows}, {length}]，对数比约为 ±1"),
                {"logprobs": logprobs, "ref_logprobs": ref.clamp(max=0.0)})


def _k(name: str, flip: bool = False):
    def run(c: Case) -> Tensor:
        a, b = c.args["logprobs"], c.args["ref_logprobs"]
        return KL_ESTIMATORS.get(name)(b, a) if flip else KL_ESTIMATORS.get(name)(a, b)

    return run


def _unclamped(c: Case) -> Tensor:
    kappa = c.args["ref_logprobs"] - c.args["logprobs"]
    return kappa.exp() - 1 - kappa


GRID = kl_case(both("logprobs −1.0 against reference log-probs −3, −1.5, −1, −0.5, −0.1 (κ = −2 … 0.9)",
                    "logprobs 为 −1.0，参考模型的 log 概率为 −3, −1.5, −1, −0.5, −0.1（κ = −2 … 0.9）"),
               [[-1.0] * 5], [[-3.0, -1.5, -1.0, -0.5, -0.1]])
EXPLAIN = by_variants(
    (_k("k3", flip=True), fixed(both("κ has the wrong sign: κ = log π_ref − log π_θ (the log of π_ref/π_θ at a token "
                                     "sampled from π_θ); with the sign flipped you estimate KL(π_ref ‖ π_θ), the "
                                     "other direction",
                                     "κ 的符号反了：κ = log π_ref − log π_θ（在从 π_θ 采样的词元上 π_ref/π_θ 的"
                                     "对数）；符号反过来，你估计的就是反方向的 KL(π_ref ‖ π_θ)"))),
    (_k("k1"), fixed(both("that is k1 = log π_θ − log π_ref (unbiased but can be negative); k3 = exp(κ) − 1 − κ is "
                          "always ≥ 0",
                          "这是 k1 = log π_θ − log π_ref（无偏，但可能为负）；k3 = exp(κ) − 1 − κ 恒 ≥ 0"))),
    (_k("k2"), fixed(both("that is k2 = κ²/2 (biased); k3 = exp(κ) − 1 − κ", "这是 k2 = κ²/2（有偏）；k3 = exp(κ) − 1 − κ"))),
    (lambda c: -_k("k3")(c), fixed(both("your k3 has the wrong sign: exp(κ) − 1 − κ ≥ 0 for every κ",
                                        "你的 k3 符号反了：对任意 κ 都有 exp(κ) − 1 − κ ≥ 0"))),
    (lambda c: (c.args["ref_logprobs"] - c.args["logprobs"]).exp() - 1,
     fixed(both("the −κ term is missing: k3 = exp(κ) − 1 − κ (without it the estimate has mean 0 and can be negative)",
                "缺少 −κ 项：k3 = exp(κ) − 1 − κ（没有这一项，估计值的均值为 0，而且可能为负）"))),
)
_BOUNDS = f"[−{K3_KAPPA_CLAMP:g}, {K3_KAPPA_CLAMP:g}]"
CLAMP = both(f"no clamp on κ: exp(κ) overflows (or the value explodes) when the policy and the reference disagree "
             f"wildly; lmpo clamps κ to {_BOUNDS} before exp (its value and gradient are "
             f"then those of the clamped κ)",
             f"没有对 κ 做截断（clamp）：策略与参考模型相差悬殊时，exp(κ) 会溢出（或数值爆炸）；lmpo 在 exp 之前"
             f"把 κ 截断到 {_BOUNDS}（数值和梯度都按截断后的 κ 计算）")

K3_DOC = {
    "en": f"""The k3 estimator of KL(π_θ ‖ π_ref) per token (Schulman 2020, "Approximating KL Divergence").

    κ = ref_logprobs − logprobs   (log of π_ref/π_θ at a token sampled from π_θ)
    k3 = exp(κ) − 1 − κ          (unbiased, always ≥ 0; k1 = −κ, k2 = κ²/2)

    logprobs:     [B, T] log π_θ of the sampled tokens (carries the gradient).
    ref_logprobs: [B, T] log π_ref of the same tokens (the frozen reference).
    returns:      [B, T] k3 per token, same shape and dtype. Masking is the caller's job.

    Conventions of lmpo (`lmpo.algos.KL_ESTIMATORS.get("k3")`): κ is clamped to
    [−{K3_KAPPA_CLAMP:g}, {K3_KAPPA_CLAMP:g}] before exp, so the result stays finite (e.g. a reference
    log-prob of −inf under top-k). GRPO adds β·k3 to each token's loss (β = 0.04).
    The gradient with respect to logprobs is 1 − exp(κ).""",
    "zh": f"""KL(π_θ ‖ π_ref) 的逐词元 k3 估计（Schulman 2020，"Approximating KL Divergence"）。

    κ = ref_logprobs − logprobs   （在从 π_θ 采样的词元上 π_ref/π_θ 的对数）
    k3 = exp(κ) − 1 − κ          （无偏，恒 ≥ 0；k1 = −κ，k2 = κ²/2）

    logprobs:     [B, T] 采样词元在 π_θ 下的 log 概率（带梯度）。
    ref_logprobs: [B, T] 同一词元在冻结参考模型 π_ref 下的 log 概率。
    返回:         [B, T] 逐词元的 k3，形状和 dtype 不变。mask 由调用方处理。

    lmpo 的约定（`lmpo.algos.KL_ESTIMATORS.get("k3")`）：exp 之前把 κ 截断到
    [−{K3_KAPPA_CLAMP:g}, {K3_KAPPA_CLAMP:g}]，使结果保持有限（例如 top-k 下参考 log 概率为 −inf）。
    GRPO 把 β·k3 加到每个词元的损失上（β = 0.04）。对 logprobs 的梯度为 1 − exp(κ)。""",
}

K3 = Exercise(
    name="k3",
    summary=both("the k3 KL estimator exp(κ) − 1 − κ, κ = log π_ref − log π_θ (GRPO's KL term)",
                 "k3 KL 估计量 exp(κ) − 1 − κ，κ = log π_ref − log π_θ（GRPO 的 KL 项）"),
    function="k3",
    signature="def k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:",
    reference=KL_ESTIMATORS.get("k3"),
    reference_label='lmpo.algos.KL_ESTIMATORS.get("k3")',
    doc=K3_DOC,
    random_case=random_case,
    probes=(
        Probe("values", both("κ from −2 to 0.9", "κ 从 −2 到 0.9"), lambda: [GRID], EXPLAIN),
        Probe("equal", both("π_θ = π_ref gives exactly 0", "π_θ = π_ref 时恰好为 0"),
              lambda: [kl_case(both("equal log-probs", "相同的 log 概率"), [[-0.3, -2.0, -7.5]], [[-0.3, -2.0, -7.5]])], EXPLAIN),
        Probe("gradient", "d k3 / d logprobs = 1 − exp(κ)", lambda: [GRID], EXPLAIN, grad=("logprobs",)),
        Probe("extreme", both(f"|κ| beyond {K3_KAPPA_CLAMP:g} is clamped", f"|κ| 超过 {K3_KAPPA_CLAMP:g} 时被截断"),
              lambda: [kl_case(both("κ = +100 and −100 (policy log-probs −100.5 and −0.5, reference −0.5 and −100.5)",
                                    "κ = +100 和 −100（策略的 log 概率为 −100.5 和 −0.5，参考模型为 −0.5 和 −100.5）"),
                               [[-100.5, -0.5]], [[-0.5, -100.5]]),
                       kl_case(both("κ = −60 (reference log-prob −60.5)", "κ = −60（参考模型的 log 概率为 −60.5）"),
                               [[-0.5]], [[-60.5]])],
              by_variants((_unclamped, fixed(CLAMP)), fallback=always(CLAMP))),
        Probe("float64", both("float64 in, float64 out", "输入 float64，输出 float64"),
              lambda: [kl_case(both("float64 log-probs", "float64 的 log 概率"), [[-1.0, -2.0]], [[-1.5, -0.5]], torch.float64)], EXPLAIN),
    ),
    plug=Plug("rl", KL_ESTIMATORS, "kl_estimator", "k3", {"beta": 0.04, "kl_placement": "loss"},
              both("the GRPO stage's KL term, β·k3 added to each token's loss (β = 0.04)",
                   "GRPO 阶段的 KL 项：把 β·k3 加到每个词元的损失上（β = 0.04）")),
)
