"""Exercises on outcome-reward advantages: GRPO's normalised advantage and RLOO's leave-one-out one."""

from __future__ import annotations

import inspect
import math

import torch
from torch import Tensor

from lmpo.algos import ADVANTAGES
from lmpo.teach.exercise.core import Case, Exercise, Explainer, Probe
from lmpo.teach.exercise.explain import always, by_variants, fixed
from lmpo.teach.exercise.lang import Text, both, cat
from lmpo.teach.exercise.plug import Plug

WORKED = [0.9, 0.6, 0.2, 0.0]  # ALGORITHMS.md's worked example


def case(label: Text, rewards: list[float], ids: list[int], dtype: torch.dtype = torch.float32,
         digits: int = 5) -> Case:
    return Case(label, {"rewards": torch.tensor(rewards, dtype=dtype), "group_ids": torch.tensor(ids, dtype=torch.long)},
                digits=digits)


def random_case(gen: torch.Generator) -> Case:
    """1–4 groups of 1–6 completions, ids shuffled; binary or continuous rewards, some groups equal."""
    groups = int(torch.randint(1, 5, (), generator=gen))
    rewards, ids = [], []
    for g in range(groups):
        size = int(torch.randint(1, 7, (), generator=gen))
        kind = int(torch.randint(0, 3, (), generator=gen))
        if kind == 0:
            values = torch.randint(0, 2, (size,), generator=gen).float()
        elif kind == 1:
            values = torch.full((size,), float(torch.rand((), generator=gen)))
        else:
            values = torch.rand(size, generator=gen) * 2 - 0.5
        rewards += values.tolist()
        ids += [10 * g + 3] * size
    order = torch.randperm(len(ids), generator=gen)
    return Case(both(f"random batch of {groups} group(s)", f"随机批次，共 {groups} 组"),
                {"rewards": torch.tensor(rewards)[order], "group_ids": torch.tensor(ids)[order]})


def _lib(name: str, **options):
    return lambda c: ADVANTAGES.get(name)(c.args["rewards"], c.args["group_ids"], **options)


def _negated(name: str):
    return lambda c: -ADVANTAGES.get(name)(c.args["rewards"], c.args["group_ids"])


def _factor(c: Case, expected: Tensor, got: Tensor) -> float:
    big = expected.abs() > 1e-6
    return float((got[big] / expected[big])[0]) if big.any() else float("nan")


def _population(c: Case, expected: Tensor, got: Tensor) -> Text:
    n = int((c.args["group_ids"] == c.args["group_ids"][0]).sum())
    factor, root = f"{_factor(c, expected, got):.4g}", f"sqrt({n}/{n - 1}) = {math.sqrt(n / (n - 1)):.4g}"
    return both(f"your std uses N instead of N-1 (population vs sample): on a group of {n} rewards your advantages "
                f"are {factor}× the reference ({root}); "
                f"lmpo's GRPO default is the sample std (Bessel's N-1, `std=\"sample\"`)",
                f"你的标准差除以的是 N 而不是 N-1（总体标准差而非样本标准差）：在 {n} 个奖励的组上，你的优势是"
                f"参考结果的 {factor} 倍（{root}）；lmpo 的 GRPO 默认使用样本标准差（Bessel 校正 N-1，"
                f"`std=\"sample\"`）")


EQUAL_GROUPS = case(both("three groups whose rewards are all equal (0.3 ×7, 1.0 ×3, 0.0 ×4), then one mixed group",
                         "三个奖励全部相等的组（0.3 ×7、1.0 ×3、0.0 ×4），再加一个奖励各不相同的组"),
                    [0.3] * 7 + [1.0] * 3 + [0.0] * 4 + [1.0, 0.0, 0.0], [0] * 7 + [1] * 3 + [2] * 4 + [3] * 3)
EQUAL_GROUPS_SYMPTOM = both(
    "advantages of an all-equal group are not zero: a group whose rewards are all equal carries no signal and "
    "every member must get exactly 0; R − mean is rounding noise there (0.3 ×7 does not average to exactly 0.3 in "
    "float32) and dividing it by std + eps ≈ 1e-6 blows it up (or 0/0 gives NaN without eps). Detect such groups "
    "(min == max) and return 0 for them",
    "奖励全部相等的组，优势却不为零：这样的组不携带任何信号，每个成员的优势都必须恰好为 0；此时 R − mean 只是"
    "舍入噪声（float32 下 7 个 0.3 的平均值并不恰好等于 0.3），再除以 std + eps ≈ 1e-6 就会被放大（没有 eps 时"
    "则是 0/0 得到 NaN）。应当识别出这样的组（min == max），直接返回 0")

SHARED_PROBES = {
    "two_groups": case(both("two prompts' groups in one batch, sizes 3 and 5", "一个批次里两个提示的组，大小分别为 3 和 5"),
                       [1.0, 0.0, 0.0, 0.5, 0.9, 0.1, 0.2, 0.4], [0, 0, 0, 1, 1, 1, 1, 1]),
    "unsorted_ids": case(both("two groups with ids 7 and 3, interleaved in the batch",
                              "id 为 7 和 3 的两个组，在批次中交错排列"),
                         [1.0, 0.2, 0.0, 0.9, 0.4, 0.5], [7, 3, 7, 3, 7, 3]),
}
NOT_PER_GROUP = both("your statistics are not per group: each completion must be compared with the other completions "
                     "of its own prompt (same group id) only",
                     "你的统计量不是按组计算的：每个回答只能与同一提示（相同 group id）下的其他回答比较")
UNSORTED = both("groups are not found by their ids: group ids may be any integers in any order (not 0..G-1, not "
                "contiguous blocks); gather each group with `group_ids == id` or torch.unique(return_inverse=True)",
                "没有按 id 找出各组：group id 可以是任意整数、任意顺序（不一定是 0..G-1，也不一定是连续的块）；"
                "请用 `group_ids == id` 或 torch.unique(return_inverse=True) 取出每个组")
CONSTANTS = both("gradient flows through the baseline: the advantages must be constants of the policy-gradient loss "
                 "(stop-gradient); detach the rewards (or the result) so no gradient reaches the group mean and std",
                 "梯度流过了基线：优势在策略梯度损失中必须是常数（stop-gradient）；对 rewards（或结果）做 detach，"
                 "使梯度不会传到组均值和组标准差")



def _whole_batch(c: Case) -> Tensor:
    r = c.args["rewards"].double()
    return ((r - r.mean()) / (r.std() + 1e-6)).to(c.args["rewards"].dtype)


_BATCH_VARIANTS = ((_lib("grpo", scale="batch"), fixed(NOT_PER_GROUP)),
                   (_whole_batch, fixed(cat(NOT_PER_GROUP, both(" (you used the mean and std of the whole batch)",
                                                                "（你用的是整个批次的均值和标准差）")))),
                   (lambda c: c.args["rewards"] - c.args["rewards"].mean(),
                    fixed(cat(NOT_PER_GROUP, both(" (you subtracted the batch mean)", "（你减去的是整个批次的均值）")))))


GRPO_EPS = inspect.signature(ADVANTAGES.get("grpo")).parameters["eps"].default
FLOAT64_CASE = case(both("float64 rewards 1 ± 1e-9: a group whose rewards differ only in the 9th decimal",
                         "float64 奖励 1 ± 1e-9：组内奖励只在小数点后第 9 位不同"),
                    [1.0 + 1e-9, 1.0, 1.0 - 1e-9, 1.0], [0, 0, 0, 0], torch.float64, digits=12)


def _eps_on_variance(c: Case) -> Tensor:
    """(R − mean) / sqrt(var + eps) per group: eps added to the variance instead of the std."""
    r, ids = c.args["rewards"].double(), c.args["group_ids"]
    out = torch.zeros_like(r)
    for g in ids.unique():
        x = r[ids == g]
        if x.numel() > 1 and bool((x != x[0]).any()):
            out[ids == g] = (x - x.mean()) / (x.var() + GRPO_EPS).sqrt()
    return out.to(c.args["rewards"].dtype)


EPS_MISSING = both(f"you forgot eps: the std of these rewards is about 1e-9, and without eps = {GRPO_EPS:g} added to "
                   f"it the tiny differences are blown up to order 1; lmpo divides by (std + eps)",
                   f"你漏掉了 eps：这些奖励的标准差约为 1e-9，不在标准差上加 eps = {GRPO_EPS:g}，微小的差异就被放大"
                   f"到 1 的量级；lmpo 除以的是 (std + eps)")
EPS_ON_VARIANCE = both(f"eps is added to the variance, not to the std: sqrt(var + {GRPO_EPS:g}) ≈ {GRPO_EPS ** 0.5:g} "
                       f"where lmpo's std + eps ≈ {GRPO_EPS:g}, so near-equal groups come out "
                       f"about {GRPO_EPS ** 0.5:g}× lmpo's; divide by (std + eps)",
                       f"eps 加在了方差上而不是标准差上：sqrt(var + {GRPO_EPS:g}) ≈ {GRPO_EPS ** 0.5:g}，而 lmpo 的 "
                       f"std + eps ≈ {GRPO_EPS:g}，于是几乎相等的组的结果约为 lmpo 的 {GRPO_EPS ** 0.5:g} 倍；应除以 (std + eps)")
GRPO_FLOAT64_EXPLAIN = by_variants((_lib("grpo", eps=0.0), fixed(EPS_MISSING)), (_eps_on_variance, fixed(EPS_ON_VARIANCE)))


def _common_probes(single_symptom: Text, float64_explain: Explainer | None = None) -> list[Probe]:
    return [
        Probe("unsorted_ids", both("group ids are arbitrary and interleaved", "group id 是任意整数且交错排列"),
              lambda: [SHARED_PROBES["unsorted_ids"]], by_variants(*_BATCH_VARIANTS, fallback=always(UNSORTED))),
        Probe("two_groups", both("statistics are per group, not per batch", "统计量按组计算，而不是按整个批次"),
              lambda: [SHARED_PROBES["two_groups"]], by_variants(*_BATCH_VARIANTS, fallback=always(NOT_PER_GROUP))),
        Probe("equal_groups", both("an all-equal group gets exactly 0", "奖励全部相等的组优势恰好为 0"),
              lambda: [EQUAL_GROUPS], always(EQUAL_GROUPS_SYMPTOM)),
        Probe("single_member", both("a group of one completion gets 0", "只有一个回答的组优势为 0"),
              lambda: [case(both("a group of one completion next to a group of three",
                                 "一个只有一个回答的组，旁边是一个有三个回答的组"), [0.7, 1.0, 0.0, 0.5], [5, 6, 6, 6])],
              always(single_symptom)),
        Probe("empty_batch", both("a batch without completions gives an empty result", "没有回答的批次返回空结果"),
              lambda: [case(both("no completions at all (N = 0)", "没有任何回答（N = 0）"), [], [])],
              always(both("an empty batch (N = 0) must give an empty [0] result",
                          "空批次（N = 0）必须返回形状为 [0] 的空结果"))),
        Probe("float64", both("float64 rewards give float64 advantages, at float64 precision",
                              "float64 的奖励得到 float64 的优势，精度也是 float64"),
              lambda: [FLOAT64_CASE], float64_explain),
        Probe("constants", both("no gradient flows through the advantages", "没有梯度流经优势"),
              lambda: [case(both("rewards that require grad", "requires_grad 的奖励"), WORKED, [0, 0, 0, 0])],
              grad=("rewards",), grad_messages={"rewards": CONSTANTS}),
    ]


_WORKED_CASE = case(both("the worked example of ALGORITHMS.md: one group of 4 rewards",
                         "ALGORITHMS.md 中的示例：一个包含 4 个奖励的组"), WORKED, [0, 0, 0, 0])
_SIGN = fixed(both("the advantages have the wrong sign: better-than-average completions get a negative advantage, "
                   "so training would push the policy away from its best answers",
                   "优势的符号反了：好于组内平均的回答得到了负的优势，训练会把策略推离它最好的回答"))
_WORKED_CHECKS = both("ALGORITHMS.md's example: rewards 0.9, 0.6, 0.2, 0.0", "ALGORITHMS.md 中的示例：奖励 0.9, 0.6, 0.2, 0.0")

GRPO_DOC = {
    "en": """GRPO advantages (DeepSeekMath, Shao et al. 2024, arXiv:2402.03300).

    A_i = (R_i − mean_j R_j) / (std_j R_j + eps),   j over the group of completion i

    rewards:   float [N], one scalar reward per completion (N = all completions of the batch).
    group_ids: int [N]; completions sampled for the same prompt share an id. Ids are arbitrary
               integers in any order (e.g. [7, 3, 7, 3]); groups may have different sizes.
    returns:   [N] advantages, same dtype as `rewards`.

    Conventions of lmpo (`lmpo.algos.ADVANTAGES.get("grpo")`, std="sample", scale="group"):
    - std is the SAMPLE std (Bessel, divide by N−1); a group of one completion has std 0.
    - eps = 1e-6, added to the std (not to the variance).
    - a group whose rewards are all equal gets exactly 0 for every member (no signal).
    - the advantages are constants of the loss: no gradient may flow back into `rewards`.
    - float64 in gives float64 out (compute in float64 and cast back if you like).
    Worked example (with eps, as `lmpo exercise check` prints it): rewards 0.9, 0.6, 0.2, 0.0 →
    1.1783, 0.43412, −0.55815, −1.0543.""",
    "zh": """GRPO 优势（DeepSeekMath，Shao 等 2024，arXiv:2402.03300）。

    A_i = (R_i − mean_j R_j) / (std_j R_j + eps)，j 取遍回答 i 所在的组

    rewards:   float [N]，每个回答一个标量奖励（N = 该批全部回答）。
    group_ids: int [N]；同一提示采样出的回答共享一个 id。id 可以是任意整数、任意顺序
               （例如 [7, 3, 7, 3]）；各组大小可以不同。
    返回:      [N] 优势，dtype 与 `rewards` 相同。

    lmpo 的约定（`lmpo.algos.ADVANTAGES.get("grpo")`，std="sample"，scale="group"）：
    - std 为样本标准差（Bessel 校正，除以 N−1）；只有一个回答的组 std 为 0。
    - eps = 1e-6，加在标准差上（不是方差上）。
    - 奖励全部相等的组，每个成员的优势都必须恰好为 0（没有信号）。
    - 优势是损失中的常数：梯度不能流回 `rewards`（stop-gradient）。
    - 输入 float64 则输出 float64（可以在 float64 中计算再转回）。
    示例（含 eps，与 `lmpo exercise check` 的输出一致）：奖励 0.9, 0.6, 0.2, 0.0 →
    1.1783, 0.43412, −0.55815, −1.0543。""",
}

GRPO = Exercise(
    name="grpo_advantages",
    summary=both("GRPO's group-normalised advantage (R − mean) / (std + eps), per prompt group",
                 "GRPO 的组内归一化优势 (R − mean) / (std + eps)，按提示分组计算"),
    function="grpo_advantages",
    signature="def grpo_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:",
    reference=ADVANTAGES.get("grpo"),
    reference_label='lmpo.algos.ADVANTAGES.get("grpo") (std="sample", scale="group", eps=1e-6)',
    doc=GRPO_DOC,
    random_case=random_case,
    probes=(
        Probe("worked_example", _WORKED_CHECKS, lambda: [_WORKED_CASE],
              by_variants((_lib("grpo", std="population"), _population),
                          (_negated("grpo"), _SIGN),
                          (_lib("dr_grpo"), fixed(both("you did not divide by the group's std (that is Dr. GRPO's "
                                                       "advantage, R − mean)",
                                                       "你没有除以组内标准差（那是 Dr. GRPO 的优势 R − mean）"))),
                          (_lib("rloo"), fixed(both("you used RLOO's leave-one-out baseline and no std",
                                                    "你用的是 RLOO 的留一法基线，也没有除以标准差"))))),
        *_common_probes(both("a group of one completion must get advantage 0: its sample std (N−1 = 0) is "
                             "taken as 0, not NaN, and R − mean is 0",
                             "只有一个回答的组优势必须为 0：它的样本标准差（N−1 = 0）取 0 而不是 NaN，"
                             "且 R − mean 为 0"), GRPO_FLOAT64_EXPLAIN),
    ),
    plug=Plug("rl", ADVANTAGES, "advantage", "grpo", {},
              both("the GRPO stage's advantage estimator", "GRPO 阶段的优势估计器")),
)

RLOO_DOC = {
    "en": """RLOO advantages (Ahmadian et al. 2024, "Back to Basics", arXiv:2402.14740).

    A_i = R_i − (1/(G−1)) Σ_{j≠i} R_j     (G = size of the group of completion i)

    rewards:   float [N], one scalar reward per completion.
    group_ids: int [N]; completions of the same prompt share an id (any integers, any order).
    returns:   [N] advantages, same dtype as `rewards`.

    Conventions of lmpo (`lmpo.algos.ADVANTAGES.get("rloo")`):
    - the baseline is the mean of the OTHER completions of the group, not including i.
    - no division by a std.
    - a group of one completion has no baseline: its advantage is 0.
    - a group whose rewards are all equal gets exactly 0.
    - the advantages are constants: no gradient may flow back into `rewards`.
    Worked example: rewards 0.9, 0.6, 0.2, 0.0 → 0.63333, 0.23333, −0.30000, −0.56667.""",
    "zh": """RLOO 优势（Ahmadian 等 2024，"Back to Basics"，arXiv:2402.14740）。

    A_i = R_i − (1/(G−1)) Σ_{j≠i} R_j     （G = 回答 i 所在组的大小）

    rewards:   float [N]，每个回答一个标量奖励。
    group_ids: int [N]；同一提示的回答共享一个 id（任意整数、任意顺序）。
    返回:      [N] 优势，dtype 与 `rewards` 相同。

    lmpo 的约定（`lmpo.algos.ADVANTAGES.get("rloo")`）：
    - 基线是同组其他回答的平均值，不包括 i 自己。
    - 不除以标准差。
    - 只有一个回答的组没有基线：优势为 0。
    - 奖励全部相等的组优势恰好为 0。
    - 优势是常数：梯度不能流回 `rewards`。
    示例：奖励 0.9, 0.6, 0.2, 0.0 → 0.63333, 0.23333, −0.30000, −0.56667。""",
}


def _includes_self(c: Case, expected: Tensor, got: Tensor) -> Text:
    n = int((c.args["group_ids"] == c.args["group_ids"][0]).sum())
    factor, ratio = f"{_factor(c, expected, got):.4g}", f"{(n - 1) / n:.4g}"
    return both(f"your baseline includes the completion itself: it must be the mean of the OTHER G−1 rewards; on a "
                f"group of {n} your advantages are {factor}× the reference ((G−1)/G = {ratio})",
                f"你的基线包含了回答自身：基线必须是同组其他 G−1 个奖励的平均值；在大小为 {n} 的组上，你的优势是"
                f"参考结果的 {factor} 倍（(G−1)/G = {ratio}）")


def _whole_sum_over_g_minus_1(c: Case) -> Tensor:
    """R_i − Σ_j R_j / (G−1), j over the whole group (i included); 0 for a group of one."""
    r, ids = c.args["rewards"].double(), c.args["group_ids"]
    out = torch.zeros_like(r)
    for g in ids.unique():
        x = r[ids == g]
        if x.numel() > 1:
            out[ids == g] = x - x.sum() / (x.numel() - 1)
    return out.to(c.args["rewards"].dtype)


SUM_INCLUDES_SELF = both("your baseline divides the sum of the WHOLE group (the completion itself included) by G−1: "
                         "the leave-one-out baseline is the sum of the OTHER rewards over G−1, "
                         "(Σ_j R_j − R_i) / (G−1)",
                         "你的基线把整组奖励之和（包括回答自身）除以了 G−1：留一法基线是其他奖励之和除以 G−1，"
                         "即 (Σ_j R_j − R_i) / (G−1)")


RLOO = Exercise(
    name="rloo_advantages",
    summary=both("RLOO's leave-one-out advantage R_i − mean of the other completions of the group",
                 "RLOO 的留一法优势：R_i 减去同组其他回答奖励的平均值"),
    function="rloo_advantages",
    signature="def rloo_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:",
    reference=ADVANTAGES.get("rloo"),
    reference_label='lmpo.algos.ADVANTAGES.get("rloo")',
    doc=RLOO_DOC,
    random_case=random_case,
    probes=(
        Probe("worked_example", _WORKED_CHECKS, lambda: [_WORKED_CASE],
              by_variants((_lib("dr_grpo"), _includes_self),
                          (_whole_sum_over_g_minus_1, fixed(SUM_INCLUDES_SELF)),
                          (_negated("rloo"), _SIGN),
                          (_lib("grpo"), fixed(both("you divided by the std: RLOO's advantage is not normalised",
                                                    "你除以了标准差：RLOO 的优势不做归一化"))))),
        *_common_probes(both("a group of one completion has no other completions to form a baseline: its "
                             "advantage must be 0 (you divide by G−1 = 0)",
                             "只有一个回答的组没有其他回答来构成基线：它的优势必须为 0（你除以了 G−1 = 0）")),
    ),
    plug=Plug("rl", ADVANTAGES, "advantage", "rloo", {"preset": "rloo"},
              both("the RLOO stage's advantage estimator", "RLOO 阶段的优势估计器")),
)
