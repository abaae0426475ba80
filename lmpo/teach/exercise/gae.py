"""Exercise: generalised advantage estimation (GAE), per token, as PPO-RLHF uses it."""

from __future__ import annotations

import torch
from torch import Tensor

from lmpo.algos import TOKEN_ADVANTAGES
from lmpo.teach.exercise.core import Case, Exercise, Probe
from lmpo.teach.exercise.explain import always, by_variants, fixed
from lmpo.teach.exercise.lang import Text, both, cat
from lmpo.teach.exercise.plug import Plug


def gae_case(label: Text, rewards: list[list[float]], values: list[list[float]], mask: list[list[float]],
             gamma: float = 1.0, lam: float = 0.95, dtype=torch.float32) -> Case:
    t = lambda x: torch.tensor(x, dtype=dtype)  # noqa: E731
    return Case(label, {"token_rewards": t(rewards), "mask": t(mask)},
                {"values": t(values), "gamma": gamma, "lam": lam})


def random_case(gen: torch.Generator) -> Case:
    rows, length = int(torch.randint(1, 4, (), generator=gen)), int(torch.randint(1, 8, (), generator=gen))
    lengths = torch.randint(1, length + 1, (rows,), generator=gen)
    mask = (torch.arange(length) < lengths[:, None]).float()
    rewards = torch.randn(rows, length, generator=gen) * 0.1
    values = torch.randn(rows, length, generator=gen) * 0.5
    gamma = float(torch.rand((), generator=gen)) * 0.3 + 0.7
    lam = float(torch.rand((), generator=gen))
    return Case(both(f"random rows ({rows} × {length}, right-padded), gamma={gamma:.3f}, lam={lam:.3f}",
                     f"随机行（{rows} × {length}，右侧填充），gamma={gamma:.3f}，lam={lam:.3f}"),
                {"token_rewards": rewards, "mask": mask}, {"values": values, "gamma": gamma, "lam": lam})


def _loop(c: Case, *, over_all: bool = False, gaps_as_steps: bool = False, decay: str = "gamma*lam",
          returns: str = "a+v", zero_masked: bool = True, bootstrap: str = "gamma") -> tuple[Tensor, Tensor]:
    """GAE written as a plain loop, with one convention changed (the wrong variants)."""
    r, m = c.args["token_rewards"].double(), c.args["mask"]
    v, gamma, lam = c.options["values"].double(), c.options["gamma"], c.options["lam"]
    k = {"gamma*lam": gamma * lam, "gamma": gamma, "lam": lam}[decay]
    discount = {"gamma": gamma, "lam": lam}[bootstrap]
    adv, disc = torch.zeros_like(r), torch.zeros_like(r)
    for b in range(r.shape[0]):
        valid = [t for t in range(r.shape[1]) if m[b, t] != 0]
        if over_all:
            steps = list(range(r.shape[1]))
        elif gaps_as_steps:
            steps = list(range(valid[-1] + 1)) if valid else []
        else:
            steps = valid
        running, next_v, ret = 0.0, 0.0, 0.0
        for t in reversed(steps):
            delta = r[b, t] + discount * next_v - v[b, t]
            running = delta + k * running
            ret = r[b, t] + gamma * ret
            adv[b, t], disc[b, t], next_v = running, ret, v[b, t]
    out = (adv, adv + v if returns == "a+v" else disc)
    if zero_masked:
        out = tuple(torch.where(m != 0, x, 0.0) for x in out)
    dtype = c.args["token_rewards"].dtype
    return tuple(x.to(dtype) for x in out)


def _shifted(case: Case, expected: tuple, got: tuple) -> Text | None:
    """Your advantages are the reference's of the next (or previous) loss token of the row: compared on
    every loss token but the one at the row's end (or start), where a shift has nothing to take."""
    mask = case.args["mask"] != 0
    want, have = expected[0].detach().double(), got[0].detach().double()
    for step, text in ((1, SHIFT_NEXT), (-1, SHIFT_PREVIOUS)):
        pairs = [(b, int(now), int(then)) for b in range(mask.shape[0])
                 for now, then in _neighbours(mask[b].nonzero().flatten().tolist(), step)]
        if len(pairs) < 2:
            continue
        mine = torch.stack([have[b, now] for b, now, _ in pairs])
        shifted = torch.stack([want[b, then] for b, _, then in pairs])
        own = torch.stack([want[b, now] for b, now, _ in pairs])
        if torch.allclose(mine, shifted, rtol=1e-4, atol=1e-5) and not torch.allclose(shifted, own, rtol=1e-4,
                                                                                       atol=1e-5):
            return text
    return None


def _neighbours(positions: list[int], step: int) -> list[tuple[int, int]]:
    """(a loss token, the loss token `step` further along the row) for every pair that exists."""
    return [(positions[i], positions[i + step]) for i in range(len(positions)) if 0 <= i + step < len(positions)]


def _negated(c: Case) -> tuple[Tensor, Tensor]:
    a, ret = TOKEN_ADVANTAGES.get("gae")(c.args["token_rewards"], c.args["mask"], **c.options)
    return -a, torch.where(c.args["mask"] != 0, -a + c.options["values"], 0.0)


RETURNS = both("your returns are the discounted sum of rewards; lmpo's returns are A + V (the λ-return), the critic's "
               "target, so that the value loss and the advantages agree",
               "你的 returns 是奖励的折扣和；lmpo 的 returns 是 A + V（λ-回报），即价值网络的训练目标，"
               "这样价值损失才与优势一致")
TERMINAL = both("you bootstrap from the value at the padding position after the last token: the value after a "
                "completion's last loss token is 0 (the episode ended), whatever the critic says at padding",
                "你用最后一个词元之后 padding 位置的价值做了自举（bootstrap）：回答的最后一个损失词元之后"
                "价值为 0（回合已结束），不管价值网络在 padding 处输出什么")
PADDING_OUT = both("padding positions get nonzero advantages/returns: both outputs must be exactly 0 where mask is 0",
                   "padding 位置的优势/returns 不为零：mask 为 0 处两个输出都必须恰好为 0")
GAPS = both("tokens with mask 0 in the middle of a row (tool output, observations) are treated as time steps: lmpo's "
            "GAE (as verl's) links each loss token to the NEXT loss token, skipping mask-0 positions, so their "
            "rewards and values are never read and discounting counts model tokens only",
            "一行中间 mask 为 0 的词元（工具输出、观测）被当成了时间步：lmpo 的 GAE（与 verl 相同）把每个损失"
            "词元接到下一个损失词元上，跳过 mask 为 0 的位置，所以不会读取它们的奖励和价值，折扣也只按模型"
            "生成的词元计")
SHIFT_NEXT = both("your advantages are off by one token: at each token you give the advantage of the NEXT loss token "
                  "(A_{t+1} where A_t belongs); walk the row backwards and store A_t at position t, after computing "
                  "it from δ_t and the A_{t+1} carried from the step before",
                  "你的优势错位了一个词元：每个词元上给出的是下一个损失词元的优势（该放 A_t 的地方放了 A_{t+1}）；"
                  "倒序遍历一行，先由 δ_t 和上一步带来的 A_{t+1} 算出 A_t，再存到位置 t")
SHIFT_PREVIOUS = both("your advantages are off by one token: at each token you give the advantage of the PREVIOUS loss "
                      "token (A_{t−1} where A_t belongs); store A_t at position t",
                      "你的优势错位了一个词元：每个词元上给出的是上一个损失词元的优势（该放 A_t 的地方放了 "
                      "A_{t−1}）；请把 A_t 存到位置 t")
SWAPPED = both("γ and λ are swapped in δ: δ_t = r_t + γ·V_{t+1} − V_t bootstraps with the discount γ; λ only weighs "
               "the later δs in A_t = δ_t + γλ·A_{t+1}. You use λ·V_{t+1}",
               "δ 中的 γ 和 λ 弄反了：δ_t = r_t + γ·V_{t+1} − V_t 用折扣因子 γ 做自举；λ 只在 A_t = δ_t + γλ·A_{t+1} "
               "中给后面的 δ 加权。你用的是 λ·V_{t+1}")
VARIANTS = (
    (lambda c: _loop(c, returns="discounted"), fixed(RETURNS)),
    (lambda c: _loop(c, bootstrap="lam"), fixed(SWAPPED)),
    # before TERMINAL: on a row without trailing padding, walking every position is walking the gaps,
    # and a padded row (where the two differ) is probed earlier, by `padding`
    (lambda c: _loop(c, gaps_as_steps=True), fixed(GAPS)),
    (lambda c: _loop(c, over_all=True), fixed(TERMINAL)),
    (lambda c: _loop(c, over_all=True, zero_masked=False), fixed(cat(TERMINAL, both("; ", "；"), PADDING_OUT))),
    (lambda c: _loop(c, decay="gamma"),
     fixed(both("your advantage ignores λ: A_t = Σ_l (γλ)^l δ_{t+l}, you use γ^l (λ = 1)",
                "你的优势忽略了 λ：A_t = Σ_l (γλ)^l δ_{t+l}，你用的是 γ^l（相当于 λ = 1）"))),
    (lambda c: _loop(c, decay="lam"),
     fixed(both("your advantage decays by λ alone: A_t = Σ_l (γλ)^l δ_{t+l}, you use λ^l (γ missing in the recursion)",
                "你的优势只按 λ 衰减：A_t = Σ_l (γλ)^l δ_{t+l}，你用的是 λ^l（递推中漏了 γ）"))),
    (_negated, fixed(both("your advantages have the wrong sign: δ_t = r_t + γ·V_{t+1} − V_t",
                          "你的优势符号反了：δ_t = r_t + γ·V_{t+1} − V_t"))),
)
EXPLAIN = by_variants(*VARIANTS, fallback=_shifted)
CONSTANTS = both("gradient flows through the values into the advantages and returns: they are targets of the policy "
                 "and value losses, constants (detach the inputs, as lmpo does)",
                 "梯度经由 values 流进了优势和 returns：它们是策略损失和价值损失的目标，是常数（像 lmpo 一样对输入"
                 "做 detach）")

GAE_DOC = {
    "en": """GAE (Schulman et al. 2015, arXiv:1506.02438) as in PPO-RLHF (Ouyang et al. 2022, arXiv:2203.02155).

    δ_t = r_t + γ·V_{t+1} − V_t
    A_t = Σ_l (γλ)^l · δ_{t+l}        (computed backwards: A_t = δ_t + γλ·A_{t+1})
    returns_t = A_t + V_t             (the critic's target)

    token_rewards: [B, T] per-token rewards (lmpo puts R_i on the last loss token, −β·KL elsewhere).
    mask:          [B, T] 1 on the model's tokens, 0 on padding and on tool / observation tokens.
    values:        [B, T] the critic's V per token (keyword argument).
    returns:       (advantages [B, T], returns [B, T]), both exactly 0 where mask is 0,
                   dtype of token_rewards.

    Conventions of lmpo (`lmpo.algos.TOKEN_ADVANTAGES.get("gae")`):
    - "t+1" is the NEXT token with mask 1 in the row: mask-0 positions in the middle (tool
      output) are skipped; their rewards and values are never read.
    - after a row's last mask-1 token V = 0 (terminal), even if the row is padded.
    - the outputs carry no gradient (the inputs are treated as constants).
    - advantages are not whitened here (the trainer may do it afterwards).""",
    "zh": """GAE（Schulman 等 2015，arXiv:1506.02438），用法同 PPO-RLHF（Ouyang 等 2022，arXiv:2203.02155）。

    δ_t = r_t + γ·V_{t+1} − V_t
    A_t = Σ_l (γλ)^l · δ_{t+l}        （倒序计算：A_t = δ_t + γλ·A_{t+1}）
    returns_t = A_t + V_t             （价值网络的目标）

    token_rewards: [B, T] 逐词元奖励（lmpo 把 R_i 放在最后一个损失词元上，其余为 −β·KL）。
    mask:          [B, T] 模型生成的词元为 1，padding 与工具/观测词元为 0。
    values:        [B, T] 价值网络对每个词元的 V（关键字参数）。
    返回:          (advantages [B, T], returns [B, T])，mask 为 0 处都恰好为 0，
                   dtype 与 token_rewards 相同。

    lmpo 的约定（`lmpo.algos.TOKEN_ADVANTAGES.get("gae")`）：
    - "t+1" 是同一行中下一个 mask 为 1 的词元：中间 mask 为 0 的位置（工具输出）被跳过，
      它们的奖励和价值不会被读取。
    - 一行最后一个 mask 为 1 的词元之后 V = 0（终止），即使该行后面有 padding。
    - 输出不带梯度（输入被当作常数）。
    - 这里不做优势白化（训练器之后可能会做）。""",
}

GAE = Exercise(
    name="gae",
    summary=both("GAE: δ_t = r_t + γV_{t+1} − V_t, A_t = Σ (γλ)^l δ_{t+l}, returns = A + V, over masked tokens",
                 "GAE：δ_t = r_t + γV_{t+1} − V_t，A_t = Σ (γλ)^l δ_{t+l}，returns = A + V，只在掩码内的词元上计算"),
    function="gae",
    signature=("def gae(token_rewards: Tensor, mask: Tensor, *, values: Tensor, gamma: float = 1.0,\n"
               "        lam: float = 1.0) -> tuple[Tensor, Tensor]:"),
    reference=TOKEN_ADVANTAGES.get("gae"),
    reference_label='lmpo.algos.TOKEN_ADVANTAGES.get("gae")',
    doc=GAE_DOC,
    random_case=random_case,
    outputs=("advantages", "returns"),
    probes=(
        Probe("one_row", both("one completion of 4 tokens, reward 1 on the last, gamma=1, lam=0.95",
                              "一个 4 词元的回答，最后一个词元奖励为 1，gamma=1，lam=0.95"),
              lambda: [gae_case("rewards [0, 0, 0, 1], values [0.5, 0.6, 0.7, 0.8], gamma=1, lam=0.95",
                                [[0, 0, 0, 1.0]], [[0.5, 0.6, 0.7, 0.8]], [[1, 1, 1, 1]])], EXPLAIN),
        Probe("gamma_lambda", both("gamma and lambda both discount (gamma=0.9, lam=0.8)",
                                   "gamma 和 lambda 都参与折扣（gamma=0.9，lam=0.8）"),
              lambda: [gae_case("rewards [0.1, 0, -0.2, 1], values [0.5, 0.6, 0.7, 0.8], gamma=0.9, lam=0.8",
                                [[0.1, 0, -0.2, 1.0]], [[0.5, 0.6, 0.7, 0.8]], [[1, 1, 1, 1]], 0.9, 0.8)],
              EXPLAIN),
        Probe("padding", both("the value after the last token is 0; padding gets 0",
                              "最后一个词元之后的价值为 0；padding 处输出 0"),
              lambda: [gae_case(both("row 0 has 2 tokens then padding whose values are 5.0",
                                     "第 0 行有 2 个词元，后面是价值为 5.0 的 padding"),
                                [[0.0, 1.0, 0.3, 0.3], [0.0, 0.0, 0.0, 1.0]],
                                [[0.4, 0.6, 5.0, 5.0], [0.1, 0.2, 0.3, 0.4]],
                                [[1, 1, 0, 0], [1, 1, 1, 1]], 0.9, 0.8)], by_variants(*VARIANTS,
                                                                                     fallback=always(PADDING_OUT))),
        Probe("tool_tokens", both("mask-0 tokens inside a row (tool output) are skipped",
                                  "跳过行内 mask 为 0 的词元（工具输出）"),
              lambda: [gae_case(both("mask [1, 1, 0, 0, 1, 1]: two tool-output tokens in the middle",
                                     "mask [1, 1, 0, 0, 1, 1]：中间有两个工具输出词元"),
                                [[0.0, 0.0, 0.7, 0.7, 0.0, 1.0]], [[0.2, 0.3, 9.0, 9.0, 0.5, 0.6]],
                                [[1, 1, 0, 0, 1, 1]], 0.9, 0.8)], by_variants(*VARIANTS, fallback=always(GAPS))),
        Probe("lambda_ends", both("lam=0 gives A = δ; lam=1 gives A = return − V",
                                  "lam=0 时 A = δ；lam=1 时 A = return − V"),
              lambda: [gae_case(f"rewards [0.2, -0.1, 1], values [0.3, 0.1, 0.9], gamma=0.95, lam={lam}",
                                [[0.2, -0.1, 1.0]], [[0.3, 0.1, 0.9]], [[1, 1, 1]], 0.95, lam)
                       for lam in (0.0, 1.0)], EXPLAIN),
        Probe("float64", both("float64 inputs give float64 outputs", "float64 输入得到 float64 输出"),
              lambda: [gae_case(both("float64 inputs", "float64 输入"), [[0.0, 1.0]], [[0.25, 0.5]], [[1, 1]], dtype=torch.float64)]),
        Probe("constants", both("no gradient flows through the outputs", "输出不带梯度"),
              lambda: [gae_case(both("values that require grad", "requires_grad 的 values"), [[0.0, 1.0]], [[0.25, 0.5]], [[1, 1]])],
              grad=("values", "token_rewards"), grad_messages={"values": CONSTANTS, "token_rewards": CONSTANTS}),
    ),
    plug=Plug("rl", TOKEN_ADVANTAGES, "advantage", "gae", {"preset": "ppo", "critic": "head"},
              both("the PPO stage's advantage estimator (critic: a value head on the policy)",
                   "PPO 阶段的优势估计器（价值网络：策略模型上的价值头）"), own_name=True),
)
