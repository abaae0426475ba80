"""Exercise: loss aggregation, GRPO's sequence mean of token means (vs DAPO's token mean)."""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from lmpo.algos import AGGREGATIONS
from lmpo.teach.exercise.core import Case, Exercise, Probe
from lmpo.teach.exercise.explain import always, by_variants, fixed
from lmpo.teach.exercise.lang import Text, both
from lmpo.teach.exercise.plug import Plug, keywords_taken


def agg_case(label: Text, loss: list[list[float]], mask: list[list[float]], dtype=torch.float32) -> Case:
    return Case(label, {"loss": torch.tensor(loss, dtype=dtype), "mask": torch.tensor(mask, dtype=dtype)})


def random_case(gen: torch.Generator) -> Case:
    rows, length = int(torch.randint(1, 6, (), generator=gen)), int(torch.randint(1, 9, (), generator=gen))
    lengths = torch.randint(0, length + 1, (rows,), generator=gen)
    mask = (torch.arange(length) < lengths[:, None]).float()
    loss = torch.randn(rows, length, generator=gen)
    return Case(both(f"random losses, {rows} row(s) × {length} tokens, right-padded (some rows may be empty)",
                     f"随机损失，{rows} 行 × {length} 个词元，右侧填充（有的行可能没有损失词元）"),
                {"loss": loss, "mask": mask})


def _token_mean(c: Case) -> Tensor:
    return AGGREGATIONS.get("token_mean")(c.args["loss"], c.args["mask"])


def _unmasked_mean(c: Case) -> Tensor:
    return c.args["loss"].mean()


def _unmasked_row_means(c: Case) -> Tensor:
    return c.args["loss"].mean(-1).mean()


def _rows_counting_empty(c: Case) -> Tensor:
    loss, mask = c.args["loss"], c.args["mask"]
    per_row = torch.where(mask != 0, loss, 0.0).sum(-1) / mask.sum(-1).clamp_min(1)
    return per_row.mean()


def _row_sums(c: Case) -> Tensor:
    loss, mask = c.args["loss"], c.args["mask"]
    return torch.where(mask != 0, loss, 0.0).sum(-1).mean()


def _columns(c: Case, *, every_column: bool) -> Tensor:
    """The means taken over the wrong axis: per position over the batch (dim 0), then over positions
    (all of them, or those with a loss token)."""
    loss, mask = c.args["loss"], c.args["mask"]
    counts = mask.sum(0)
    per_column = torch.where(mask != 0, loss, 0.0).sum(0) / counts.clamp_min(1)
    return per_column.mean() if every_column else per_column[counts > 0].mean()


TOKEN_MEAN = both("token-mean vs sequence-mean aggregation: you divide the sum over all loss tokens by the batch's "
                  "token count (DAPO's token_mean), so a long sequence weighs more and the loss changes when one "
                  "sequence gets longer; GRPO's seq_mean_token_mean averages each sequence over its own tokens first, "
                  "then averages the sequences",
                  "聚合用成了词元均值而不是序列均值：你用所有损失词元的总和除以整个批次的词元数（DAPO 的 "
                  "token_mean），于是长序列权重更大，某个序列一变长损失就跟着变；GRPO 的 seq_mean_token_mean "
                  "先在每个序列自己的词元上取平均，再对各序列取平均")
PADDING = both("padding tokens change the loss: the mask is not applied (mask-0 positions must count neither in the "
               "sums nor in the lengths)",
               "padding 词元改变了损失：没有应用掩码（mask 为 0 的位置既不能计入求和，也不能计入长度）")
EMPTY_ROW = both("an all-padding row counts as a sequence: only rows with at least one loss token are sequences (a "
                 "row may be fully masked, e.g. an overlong completion masked out), so your mean divides by too many",
                 "全是 padding 的行被算成了一个序列：只有至少含一个损失词元的行才是序列（一行可能被整行 mask 掉，"
                 "例如被屏蔽的超长回答），所以你的均值除以的序列数偏多")
WRONG_AXIS = both("you averaged over the wrong axis: per position over the batch (dim 0), then over the positions; "
                  "a sequence is a ROW, so average each row over its own loss tokens (dim −1, dividing by L_i), then "
                  "average those row means over the G sequences",
                  "你在错误的维度上取了平均：先对每个位置在批次维（dim 0）上平均，再对各位置平均；一个序列是一"
                  "行，所以应先在每一行自己的损失词元上取平均（dim −1，除以 L_i），再对这 G 个序列的均值取平均")
VARIANTS = (
    (_token_mean, fixed(TOKEN_MEAN)),
    (lambda c: _columns(c, every_column=True), fixed(WRONG_AXIS)),
    (lambda c: _columns(c, every_column=False), fixed(WRONG_AXIS)),
    (_unmasked_mean, fixed(PADDING)),
    (_unmasked_row_means, fixed(PADDING)),
    (_rows_counting_empty, fixed(EMPTY_ROW)),
    (_row_sums, fixed(both("you sum each sequence's token losses instead of averaging them over the sequence's length",
                           "你把每个序列的词元损失相加，而没有按序列长度取平均"))),
)
EXPLAIN = by_variants(*VARIANTS)


def _longer_sequence(c: Case, expected: Tensor, got: Tensor) -> Text:
    want, have = f"{expected.item():g}", f"{got.item():.4g}"
    return both(f"token-mean vs sequence-mean aggregation: the loss changes when one sequence gets longer: row 0 has "
                f"loss 1.0 on each of its 6 tokens, row 1 loss 0.0 on its 2 tokens; each sequence's mean is unchanged "
                f"by its length, so the sequence mean is {want}; you give {have} (a token mean gives "
                f"6/8 = 0.75: long sequences weigh more)",
                f"聚合用成了词元均值而不是序列均值：某个序列一变长，损失就跟着变。第 0 行 6 个词元的损失都是 1.0，"
                f"第 1 行 2 个词元的损失都是 0.0；每个序列的均值与其长度无关，所以序列均值是 {want}；你给出的是 "
                f"{have}（词元均值会得到 6/8 = 0.75：长序列权重更大）")


AGG_DOC = {
    "en": """Loss aggregation "seq_mean_token_mean" (original GRPO, Shao et al. 2024, arXiv:2402.03300).

    loss = (1/G) Σ_i (1/L_i) Σ_t ℓ_{i,t} · mask_{i,t},   L_i = Σ_t mask_{i,t}

    loss:    [B, T] per-token losses ℓ (from the policy loss); may be NaN/inf where mask is 0.
    mask:    [B, T] 1 on loss tokens, 0 on padding (and prompt / tool tokens).
    returns: a scalar (0-dim tensor), differentiable with respect to `loss`.

    G counts the rows with at least one loss token: a fully masked row is not a sequence.
    A batch with no loss token at all gives 0, not NaN. Compare DAPO's "token_mean",
    Σ_{i,t} ℓ_{i,t} / Σ_i L_i, where a long sequence weighs more.
    lmpo's function also takes the counts of the whole global batch (num_sequences,
    num_tokens) for gradient accumulation; with one micro-batch they are this batch's own.""",
    "zh": """损失聚合 "seq_mean_token_mean"（原始 GRPO，Shao 等 2024，arXiv:2402.03300）。

    loss = (1/G) Σ_i (1/L_i) Σ_t ℓ_{i,t} · mask_{i,t}，  L_i = Σ_t mask_{i,t}

    loss:    [B, T] 逐词元损失 ℓ（来自策略损失）；mask 为 0 处可能是 NaN/inf。
    mask:    [B, T] 计入损失的词元为 1，padding（以及提示、工具输出）为 0。
    返回:    标量（0 维张量），对 `loss` 可微。

    G 只计至少有一个损失词元的行：全部被 mask 的行不算一个序列。
    一个损失词元都没有的批次返回 0，而不是 NaN。对比 DAPO 的 "token_mean"：
    Σ_{i,t} ℓ_{i,t} / Σ_i L_i，长序列权重更大。
    lmpo 的函数还接受整个全局批次的计数（num_sequences、num_tokens），用于梯度累积；
    只有一个 micro-batch 时它们就是本批次自己的计数。""",
}


def wrap_aggregation(fn: Callable) -> Callable:
    """The user's aggregation with the registry's keywords (the global counts are passed on only if
    the user's function takes them; with one micro-batch per step they equal the batch's own)."""

    def aggregate(loss, mask, *, num_sequences=None, num_tokens=None, max_len=None):
        counts = {"num_sequences": num_sequences, "num_tokens": num_tokens, "max_len": max_len}
        return fn(loss, mask, **keywords_taken(fn, counts))

    return aggregate


AGGREGATION = Exercise(
    name="aggregation",
    summary=both("token losses → one number: GRPO's sequence mean of token means (vs DAPO's token mean)",
                 "把词元损失聚合成一个数：GRPO 先在每个序列内对词元取均值、再对序列取均值（对比 DAPO 的词元均值）"),
    function="seq_mean_token_mean",
    signature="def seq_mean_token_mean(loss: Tensor, mask: Tensor) -> Tensor:",
    reference=AGGREGATIONS.get("seq_mean_token_mean"),
    reference_label='lmpo.algos.AGGREGATIONS.get("seq_mean_token_mean")',
    doc=AGG_DOC,
    random_case=random_case,
    probes=(
        Probe("ragged", both("three sequences of 4, 2 and 1 loss tokens", "三个序列，分别有 4、2、1 个损失词元"),
              lambda: [agg_case(both("rows of length 4, 2, 1 (right-padded)", "长度为 4、2、1 的行（右侧填充）"),
                                [[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 5.0, 7.0], [-3.0, 9.0, 9.0, 9.0]],
                                [[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])], EXPLAIN),
        Probe("longer_sequence", both("a longer sequence does not weigh more", "更长的序列不会占更大的权重"),
              lambda: [agg_case(both("row 0: 6 tokens of loss 1.0; row 1: 2 tokens of loss 0.0",
                                     "第 0 行：6 个损失为 1.0 的词元；第 1 行：2 个损失为 0.0 的词元"),
                                [[1.0] * 6, [0.0] * 6], [[1] * 6, [1, 1, 0, 0, 0, 0]])],
              by_variants(fallback=_longer_sequence)),
        Probe("padding", both("values at padding do not count", "padding 处的值不计入"),
              lambda: [agg_case(both("padding holds large losses", "padding 处是很大的损失值"), [[1.0, 1.0, 50.0], [3.0, 80.0, 90.0]],
                                [[1, 1, 0], [1, 0, 0]])], by_variants(*VARIANTS, fallback=always(PADDING))),
        Probe("nan_padding", both("NaN/inf at padding do not leak in", "padding 处的 NaN/inf 不会混进结果"),
              lambda: [agg_case(both("padding holds NaN and inf", "padding 处是 NaN 和 inf"),
                                [[1.0, float("nan")], [2.0, float("inf")]], [[1, 0], [1, 0]])],
              always(both("NaN/inf at padding leak into your result: multiplying by the mask keeps them "
                          "(0 × NaN = NaN); select with torch.where(mask != 0, loss, 0)",
                          "padding 处的 NaN/inf 混进了你的结果：乘以掩码去不掉它们（0 × NaN = NaN）；"
                          "请用 torch.where(mask != 0, loss, 0) 来选取"))),
        Probe("empty_row", both("a fully masked row is not a sequence", "整行被 mask 掉的行不算序列"),
              lambda: [agg_case(both("row 1 has no loss token", "第 1 行没有损失词元"), [[1.0, 3.0], [5.0, 5.0], [2.0, 2.0]],
                                [[1, 1], [0, 0], [1, 0]])], by_variants(*VARIANTS, fallback=always(EMPTY_ROW))),
        Probe("all_masked", both("a batch with no loss token gives 0", "没有损失词元的批次返回 0"),
              lambda: [agg_case(both("every position masked", "所有位置都被 mask 掉"), [[1.0, 2.0], [3.0, 4.0]],
                                [[0, 0], [0, 0]])],
              always(both("a batch without any loss token must give 0, not NaN (0/0): clamp the counts to at least 1",
                          "一个损失词元都没有的批次必须返回 0，而不是 NaN（0/0）：把计数 clamp 到至少为 1"))),
        Probe("gradient", both("the gradient with respect to each token's loss is mask_{i,t} / (G·L_i)",
                               "对每个词元损失的梯度为 mask_{i,t} / (G·L_i)"),
              lambda: [agg_case(both("rows of length 3 and 1", "长度为 3 和 1 的行"), [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]],
                                [[1, 1, 1], [1, 0, 0]])], EXPLAIN, grad=("loss",)),
    ),
    plug=Plug("rl", AGGREGATIONS, "aggregation", "seq_mean_token_mean", {},
              both("the GRPO stage's loss aggregation (also of its KL term)", "GRPO 阶段的损失聚合（其 KL 项也用它聚合）"),
              wrap=wrap_aggregation),
)
