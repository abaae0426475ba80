"""Exercise: PPO's clipped surrogate loss, per token."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from lmpo.algos import POLICY_LOSSES
from lmpo.teach.exercise.core import Case, Exercise, Probe
from lmpo.teach.exercise.explain import always, by_variants, fixed
from lmpo.teach.exercise.lang import Text, both
from lmpo.teach.exercise.plug import Plug, keywords_taken

RATIOS = [0.5, 0.75, 0.9, 1.0, 1.1, 1.3, 2.0]
OLD = -1.2  # the behaviour policy's log-prob of every token of the grid


def first(out: Any) -> Any:
    """The loss of a ``(loss, indicators)`` pair; a bare loss as it is."""
    return out[0] if isinstance(out, tuple) else out


def loss_case(label: Text, ratios: Tensor, advantages: Tensor, mask: Tensor | None = None,
              old: Tensor | None = None, **options: float) -> Case:
    old = torch.full_like(ratios, OLD) if old is None else old
    mask = torch.ones_like(ratios) if mask is None else mask
    return Case(label, {"logprobs": old + ratios.log(), "old_logprobs": old, "advantages": advantages, "mask": mask},
                options)


def grid_case(eps_low: float = 0.2, eps_high: float = 0.2) -> Case:
    ratios = torch.tensor([RATIOS, RATIOS])
    adv = torch.tensor([[1.0], [-1.0]]).expand_as(ratios).contiguous()
    label = both(f"ratios {RATIOS} (row 0: A=+1, row 1: A=-1), clip_eps_low={eps_low}, clip_eps_high={eps_high}",
                 f"比值 {RATIOS}（第 0 行 A=+1，第 1 行 A=-1），clip_eps_low={eps_low}，clip_eps_high={eps_high}")
    return loss_case(label, ratios, adv, clip_eps_low=eps_low, clip_eps_high=eps_high)


def random_case(gen: torch.Generator) -> Case:
    rows, length = int(torch.randint(1, 5, (), generator=gen)), int(torch.randint(1, 9, (), generator=gen))
    old = -torch.rand(rows, length, generator=gen) * 4 - 0.05
    ratios = (torch.randn(rows, length, generator=gen) * 0.4).exp()
    adv = (torch.randn(rows, 1, generator=gen)).expand(rows, length).contiguous()
    lengths = torch.randint(1, length + 1, (rows,), generator=gen)
    mask = (torch.arange(length) < lengths[:, None]).float()
    return loss_case(both(f"random batch of {rows} row(s) × {length} tokens, right-padded",
                          f"随机批次，{rows} 行 × {length} 个词元，右侧填充"), ratios, adv, mask, old)


def _ratio_and_adv(c: Case) -> tuple[Tensor, Tensor]:
    return (c.args["logprobs"] - c.args["old_logprobs"]).exp(), c.args["advantages"]


def _variant(form: Callable[[Tensor, Tensor, Tensor], Tensor]) -> Callable[[Case], Tensor]:
    def run(c: Case) -> Tensor:
        r, a = _ratio_and_adv(c)
        clipped = r.clamp(1 - c.options.get("clip_eps_low", 0.2), 1 + c.options.get("clip_eps_high", 0.2))
        return torch.where(c.args["mask"] != 0, form(r, clipped, a), 0.0)

    return run


def _cell_symptom(c: Case, expected: Tensor, got: Tensor) -> Text:
    """Which clip region the first differing token is in, and what the loss must be there."""
    r, a = _ratio_and_adv(c)
    lo, hi = 1 - c.options.get("clip_eps_low", 0.2), 1 + c.options.get("clip_eps_high", 0.2)
    bad = ~torch.isclose(got.double(), expected.double(), rtol=1e-4, atol=1e-5)
    i, t = (int(x) for x in bad.nonzero()[0])
    ratio, adv, want, have = r[i, t].item(), a[i, t].item(), expected[i, t].item(), got[i, t].item()
    unclipped, clipped = f"−r·A = {-ratio * adv:.4g}", f"−clip(r, {lo:g}, {hi:g})·A = {-min(max(ratio, lo), hi) * adv:.4g}"
    terms = both(f"at ratio {ratio:.3g}, A={adv:g}: the loss is the larger of {unclipped} and {clipped}, "
                 f"i.e. {want:.4g}; you give {have:.4g}",
                 f"在比值 {ratio:.3g}、A={adv:g} 处：损失取 {unclipped} 与 {clipped} 中较大的一个，即 {want:.4g}；"
                 f"你给出的是 {have:.4g}")
    if adv < 0 and ratio < lo:
        why = both("the clip is applied on the wrong side for negative advantages: a token whose probability has "
                   "already dropped below (1−ε)·π_old gets no further push down",
                   "负优势时裁剪放错了一侧：概率已经降到 (1−ε)·π_old 以下的词元不应再被继续往下压")
    elif adv < 0 and ratio > hi:
        why = both("for a negative advantage a ratio above 1+ε must NOT be clipped: the pessimistic bound keeps the "
                   "full loss −r·A (only the lower side is clipped when A < 0)",
                   "负优势时，高于 1+ε 的比值不能裁剪：悲观下界保留完整的损失 −r·A（A < 0 时只裁剪下侧）")
    elif adv > 0 and ratio > hi:
        why = both("for a positive advantage the ratio must be clipped at 1+ε (clip_eps_high)",
                   "正优势时，比值必须在 1+ε（clip_eps_high）处裁剪")
    elif adv > 0 and ratio < lo:
        why = both("for a positive advantage a ratio below 1−ε must NOT be clipped: the pessimistic bound keeps the "
                   "full loss −r·A (only the upper side is clipped when A > 0)",
                   "正优势时，低于 1−ε 的比值不能裁剪：悲观下界保留完整的损失 −r·A（A > 0 时只裁剪上侧）")
    else:
        why = both("inside the clip range the loss must be the unclipped −r·A", "在裁剪范围内，损失必须是未裁剪的 −r·A")
    return {"en": f"{why['en']}: {terms['en']}", "zh": f"{why['zh']}。{terms['zh']}"}


_SIGN = fixed(both("the loss has the wrong sign: minimising it would lower the probability of tokens with a positive "
                   "advantage (the surrogate is maximised, so the loss is −min(r·A, clip(r)·A))",
                   "损失的符号反了：最小化它会降低正优势词元的概率（代理目标是要最大化的，所以损失是 "
                   "−min(r·A, clip(r)·A)）"))
GRID_EXPLAIN = by_variants(
    (_variant(lambda r, c, a: torch.minimum(r * a, c * a)), _SIGN),
    (_variant(lambda r, c, a: -torch.maximum(r * a, c * a)),
     fixed(both("you take the max (optimistic) of the two surrogate terms instead of the min (pessimistic): the loss "
                "is −min(r·A, clip(r)·A), so whichever term gives the larger loss wins",
                "你对两个代理项取了 max（乐观）而不是 min（悲观）：损失是 −min(r·A, clip(r)·A)，哪一项给出的损失"
                "更大就取哪一项"))),
    (_variant(lambda r, c, a: -r * a), fixed(both("the ratio is never clipped: the loss is −r·A everywhere",
                                                  "比值从未被裁剪：你的损失处处都是 −r·A"))),
    (_variant(lambda r, c, a: -c * a),
     fixed(both("you always use the clipped term −clip(r)·A: the loss is −min(r·A, clip(r)·A), which keeps −r·A "
                "when that is the larger loss (ratio below 1−ε with A > 0, above 1+ε with A < 0)",
                "你总是用裁剪后的项 −clip(r)·A：损失是 −min(r·A, clip(r)·A)，当 −r·A 给出的损失更大时应保留 −r·A"
                "（A > 0 且比值低于 1−ε，或 A < 0 且比值高于 1+ε）"))),
    fallback=_cell_symptom,
)

PADDING = both("padding tokens change the loss: the mask is not applied (where mask is 0 the loss must be exactly 0, "
               "whatever the log-probs and advantages there)",
               "padding 词元改变了损失：没有应用掩码（mask 为 0 处损失必须恰好为 0，不管那里的 log 概率和优势是多少）")
NAN_PADDING = both("your loss is NaN at padding positions whose log-probs are -inf (as after top-k sampling): "
                   "multiplying by the mask lets them through (0 × inf = NaN); select with torch.where(mask != 0, …, 0)",
                   "padding 位置的 log 概率为 -inf 时（例如 top-k 采样之后），你的损失是 NaN：乘以掩码挡不住它们"
                   "（0 × inf = NaN）；请用 torch.where(mask != 0, …, 0) 来选取")
NAN_GRADIENT = both("your loss is right but its gradient is NaN at padding positions whose log-probs are -inf: "
                    "exp(−inf − (−inf)) = exp(NaN) is computed there, and torch.where on the loss does not stop "
                    "that NaN in the backward pass (the unselected branch gets 0 × NaN = NaN); mask the log-ratio "
                    "before exp: ρ = torch.where(mask != 0, logprobs − old_logprobs, 0), then r = ρ.exp()",
                    "你的损失数值正确，但在 log 概率为 -inf 的 padding 位置梯度是 NaN：那里算了 "
                    "exp(−inf − (−inf)) = exp(NaN)，而对损失用 torch.where 挡不住反向传播中的这个 NaN（未被选中的"
                    "分支得到 0 × NaN = NaN）；请在 exp 之前对对数比做掩码：ρ = torch.where(mask != 0, logprobs − "
                    "old_logprobs, 0)，然后 r = ρ.exp()")
CLIP_HIGHER = both("clip-higher: the upper bound must be 1 + clip_eps_high and the lower one 1 − clip_eps_low; you use "
                   "one ε for both sides (or swapped them)",
                   "clip-higher：上界必须是 1 + clip_eps_high，下界是 1 − clip_eps_low；你两侧用了同一个 ε（或把两者用反了）")


def _padding_case() -> Case:
    ratios = torch.tensor([[1.1, 0.9, 1.5, 0.6], [1.0, 1.3, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    return loss_case(both("two rows padded on the right; padding has ratio 1.5/0.6/1.0 and a nonzero advantage",
                          "两行，右侧填充；padding 处的比值为 1.5/0.6/1.0，优势不为零"), ratios,
                     torch.tensor([[0.7] * 4, [-0.4] * 4]), mask)


def _inf_padding_case() -> Case:
    c = _padding_case()
    pad = c.args["mask"] == 0
    logprobs = c.args["logprobs"].masked_fill(pad, float("-inf"))
    old = c.args["old_logprobs"].masked_fill(pad, float("-inf"))
    return Case(both("padding whose log-probs are -inf", "log 概率为 -inf 的 padding"), {**c.args, "logprobs": logprobs, "old_logprobs": old})


PPO_DOC = {
    "en": """PPO's clipped surrogate, per token (Schulman et al. 2017, arXiv:1707.06347).

    ρ = logprobs − old_logprobs,  r = exp(ρ)
    ℓ = −min(r·A, clip(r, 1−clip_eps_low, 1+clip_eps_high)·A)

    logprobs:     [B, T] log π_θ of the sampled tokens (carries the gradient).
    old_logprobs: [B, T] log π_old, the policy that sampled them: a constant (no gradient).
    advantages:   [B, T] the advantage of each token (a sequence's advantage repeated): a constant.
    mask:         [B, T] 1 on completion tokens that count in the loss, 0 on padding (and on
                  prompt / tool tokens). Log-probs at mask-0 positions may be garbage, even -inf.
    returns:      [B, T] the per-token loss, exactly 0 where mask is 0 (aggregation is separate).

    Clip-higher (DAPO) is clip_eps_high > clip_eps_low. lmpo's `ppo_clip` returns
    (loss, indicators); here returning the loss alone is enough. lmpo also clamps ρ to
    [−20, 20] before exp so that r stays finite; the checks keep |ρ| well below that.""",
    "zh": """PPO 裁剪代理损失，逐词元（Schulman 等 2017，arXiv:1707.06347）。

    ρ = logprobs − old_logprobs，r = exp(ρ)
    ℓ = −min(r·A, clip(r, 1−clip_eps_low, 1+clip_eps_high)·A)

    logprobs:     [B, T] 采样词元在 π_θ 下的 log 概率（带梯度）。
    old_logprobs: [B, T] 采样时策略 π_old 的 log 概率：常数（无梯度）。
    advantages:   [B, T] 每个词元的优势（序列优势重复到每个词元）：常数。
    mask:         [B, T] 计入损失的回答词元为 1，padding（以及提示、工具输出）为 0。
                  mask 为 0 的位置上的 log 概率可能是任意值，甚至 -inf。
    返回:         [B, T] 逐词元损失，mask 为 0 处恰好为 0（聚合另行处理）。

    Clip-higher（DAPO）即 clip_eps_high > clip_eps_low。lmpo 的 `ppo_clip` 返回
    (loss, indicators)；这里只返回 loss 即可。lmpo 在 exp 前把 ρ 截到 [−20, 20]，
    以保证 r 有限；检查中的 |ρ| 远小于此值。""",
}


def wrap_policy_loss(fn: Callable) -> Callable:
    """The user's loss with the registry's convention: ``(loss, indicators)``, ``clipped`` included
    (for the run's clip-fraction figure: where the clipped term gives the larger loss)."""

    def policy_loss(logprobs, old_logprobs, advantages, mask, *, clip_eps_low=0.2, clip_eps_high=0.2):
        options = keywords_taken(fn, {"clip_eps_low": clip_eps_low, "clip_eps_high": clip_eps_high})
        out = fn(logprobs, old_logprobs, advantages, mask, **options)
        loss, indicators = (out if isinstance(out, tuple) else (out, {}))
        if "clipped" not in indicators:
            with torch.no_grad():
                valid = mask != 0
                ratio = torch.where(valid, logprobs - old_logprobs, 0.0).exp()
                adv = torch.where(valid, advantages.expand_as(ratio), 0.0)
                clipped = -ratio.clamp(1 - clip_eps_low, 1 + clip_eps_high) * adv > -ratio * adv
                indicators = {**indicators, "clipped": (clipped & valid).to(loss.dtype)}
        return loss, indicators

    return policy_loss


PPO_CLIP = Exercise(
    name="ppo_clip_loss",
    summary=both("PPO's clipped surrogate −min(r·A, clip(r, 1−ε, 1+ε)·A) per token, with the mask",
                 "PPO 的裁剪代理损失 −min(r·A, clip(r, 1−ε, 1+ε)·A)，逐词元计算，带掩码"),
    function="ppo_clip_loss",
    signature=("def ppo_clip_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,\n"
               "                  clip_eps_low: float = 0.2, clip_eps_high: float = 0.2) -> Tensor:"),
    reference=POLICY_LOSSES.get("ppo_clip"),
    reference_label=both('lmpo.algos.POLICY_LOSSES.get("ppo_clip") (its loss; dual_clip off)',
                         'lmpo.algos.POLICY_LOSSES.get("ppo_clip")（取其 loss；不启用 dual_clip）'),
    doc=PPO_DOC,
    random_case=random_case,
    project=first,
    probes=(
        Probe("clip_grid", both("every clip region: ratios 0.5 … 2.0 × A = ±1", "每个裁剪区间：比值 0.5 … 2.0 × A = ±1"),
              lambda: [grid_case()], GRID_EXPLAIN),
        Probe("clip_higher", both("clip_eps_low and clip_eps_high are used on their own sides",
                                  "clip_eps_low 与 clip_eps_high 各自用在自己那一侧"),
              lambda: [grid_case(0.2, 0.28), grid_case(0.1, 0.5)], by_variants(fallback=always(CLIP_HIGHER))),
        Probe("padding", both("the loss is 0 where mask is 0", "mask 为 0 处损失为 0"), lambda: [_padding_case()],
              always(PADDING)),
        Probe("inf_padding", both("-inf log-probs at padding give 0, not NaN",
                                  "padding 处 log 概率为 -inf 时得到 0，而不是 NaN"), lambda: [_inf_padding_case()],
              always(NAN_PADDING)),
        Probe("gradient", both("the gradient reaches the log-probs, and only them", "梯度只传到 logprobs，不传到别处"),
              lambda: [grid_case(), _padding_case()], GRID_EXPLAIN,
              grad=("logprobs", "old_logprobs", "advantages"),
              grad_messages={
                  "old_logprobs": both("gradient flows through the old log-probs (missing stop-gradient / detach): "
                                       "π_old is the policy that sampled the batch, a constant of the loss",
                                       "梯度流过了旧策略的 log 概率（缺少 stop-gradient / detach）：π_old 是采样这批"
                                       "数据的策略，是损失中的常数"),
                  "advantages": both("gradient flows through the advantages (missing stop-gradient / detach): they "
                                     "are constants of the policy-gradient loss",
                                     "梯度流过了优势（缺少 stop-gradient / detach）：优势是策略梯度损失中的常数")}),
        Probe("inf_padding_gradient", both("-inf log-probs at padding give a finite gradient",
                                           "padding 处 log 概率为 -inf 时梯度仍是有限值"),
              lambda: [_inf_padding_case()], always(NAN_PADDING), grad=("logprobs",),
              grad_nan_messages={"logprobs": NAN_GRADIENT}),
        Probe("extreme_ratios", both("ratios far outside the clip range (|ρ| up to 8)",
                                     "远超裁剪范围的比值（|ρ| 最大为 8）"),
              lambda: [loss_case(both("log-ratios ±8 (ratio 2981 and 0.00034) with A = ±1",
                                      "对数比 ±8（比值 2981 和 0.00034），A = ±1"),
                                 torch.tensor([[8.0, -8.0], [8.0, -8.0]]).exp(),
                                 torch.tensor([[1.0, 1.0], [-1.0, -1.0]]))], GRID_EXPLAIN),
    ),
    plug=Plug("rl", POLICY_LOSSES, "loss", "ppo_clip", {"num_minibatches": 2},
              both("the GRPO stage's policy loss (2 minibatches per step, so the second one sees ratios ≠ 1 and the "
                   "clip matters)",
                   "GRPO 阶段的策略损失（每步 2 个 minibatch，第二个 minibatch 的比值 ≠ 1，裁剪才起作用）"),
              wrap=wrap_policy_loss),
)

