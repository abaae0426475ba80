"""The recommendation's sentences (`lmpo.teach.compare.summary.recommend`) in each language; part
of `lmpo.teach.compare.texts.TEXTS`. Gaps and spreads are in points (百分点)."""

from __future__ import annotations

RECOMMEND: dict[str, dict[str, str]] = {
    "rec.nothing": {"en": "compare: no run has a held-out accuracy (eval_problems=0?); nothing to recommend",
                    "zh": "compare：没有一次运行有留出集准确率（eval_problems=0？）；无从推荐"},
    "rec.highest": {"en": "Highest mean held-out accuracy: {best}, {accuracy} over {n} seed(s) ({label}: {start}).",
                    "zh": "留出集平均准确率最高：{best}，{accuracy}，共 {n} 个种子（{label}：{start}）。"},
    "rec.same": {"en": "{other}: the same accuracy as {best}.", "zh": "{other}：准确率与 {best} 相同。"},
    "rec.one_seed": {"en": "{other}: {gap:.1f} points below; one seed, so no spread to judge it by.",
                     "zh": "{other}：低 {gap:.1f} 个百分点；只有一个种子，没有种子间的波动可作判断。"},
    "rec.beyond": {"en": "{other}: {gap:.1f} points below, more than the seeds' spread ({spread:.1f} points).",
                   "zh": "{other}：低 {gap:.1f} 个百分点，超过种子间的波动（{spread:.1f} 个百分点）。"},
    "rec.within": {"en": "{other}: {gap:.1f} points below, within the seeds' spread ({spread:.1f} points).",
                   "zh": "{other}：低 {gap:.1f} 个百分点，在种子间的波动之内（{spread:.1f} 个百分点）。"},
    "rec.worse": {"en": "No method improved on the {label}: the best, {best}, ended {drop:.1f} points below it.",
                  "zh": "没有方法比 {label}更好：最好的 {best} 最终仍比它低 {drop:.1f} 个百分点。"},
    "rec.not_beyond_start": {"en": "No method beat the {label} by more than the seeds' spread ({gain:+.1f} points).",
                             "zh": "没有方法比 {label}高出的幅度超过种子间的波动（{gain:+.1f} 个百分点）。"},
    "rec.level_start": {"en": "{best} ended where the {label} was ({start}).",
                        "zh": "{best} 最终停在 {label}的水平（{start}）。"},
    "rec.gained": {"en": "{best} gained {gain:+.1f} points over the {label}.",
                   "zh": "{best} 比 {label}提高了 {gain:+.1f} 个百分点。"},
    "rec.within_best": {"en": "Within noise of the best", "zh": "与最好的方法相差在波动之内"},
    "rec.level_best": {"en": "Level with the best (the same accuracy)", "zh": "与最好的方法持平（准确率相同）"},
    "rec.tied": {"en": "{together}: {names}; least wall time: {fastest} ({seconds:.0f} s), least peak memory: "
                       "{leanest} ({mb}).",
                 "zh": "{together}：{names}；耗时最少：{fastest}（{seconds:.0f} 秒），峰值内存最小：{leanest}（{mb}）。"},
    "rec.why_lean": {"en": "the leanest in memory", "zh": "内存占用最小的"},
    "rec.why_quick": {"en": "the quickest", "zh": "最快的"},
    "rec.time_tie": {"en": "{names}, tied", "zh": "{names} 并列"},
    "rec.why_quick_tie": {"en": "tied with {others} for the quickest", "zh": "与 {others} 并列最快的"},
    "rec.best_of_noise": {"en": "Recommendation: {choice} — the most accurate, and {why} of the methods within noise "
                                "of it.",
                          "zh": "推荐：{choice} —— 准确率最高，也是与它相差在波动之内的方法中{why}。"},
    "rec.best_of_level": {"en": "Recommendation: {choice} — as accurate as {others} here, and {why} of them.",
                          "zh": "推荐：{choice} —— 在这里与 {others} 一样准确，也是其中{why}。"},
    "rec.other_of_noise": {"en": "Recommendation: {choice} — as accurate as {best} within noise, and {why} of those.",
                           "zh": "推荐：{choice} —— 在波动之内与 {best} 一样准确，也是这些方法中{why}。"},
    "rec.other_of_level": {"en": "Recommendation: {choice} — as accurate as {best} here, and {why} of those.",
                           "zh": "推荐：{choice} —— 在这里与 {best} 一样准确，也是这些方法中{why}。"},
    "rec.more_seeds": {"en": " Rerun with more --seeds to tell whether {best}'s lead over {undecided} is more than "
                             "noise.",
                       "zh": "用更多 --seeds 重跑，才能判断 {best} 对 {undecided} 的领先是否超出波动。"},
    "rec.undecided": {"en": "Recommendation: {best} on these numbers; rerun with more --seeds to tell whether its lead "
                            "over {undecided} is more than noise.",
                      "zh": "推荐：按这些数字是 {best}；用更多 --seeds 重跑，才能判断它对 {undecided} 的领先是否超出波动。"},
    "rec.only_trained": {"en": "Recommendation: {best} — the only method that trained within the budget, so none to "
                               "rank it against.",
                         "zh": "推荐：{best} —— 它是唯一在预算内训练了的方法，没有别的方法可与它比较。"},
    "rec.only_compared": {"en": "Recommendation: {best} — the only method compared, so none to rank it against.",
                          "zh": "推荐：{best} —— 它是唯一参与比较的方法，没有别的方法可与它比较。"},
    "rec.ahead": {"en": "Recommendation: {best} — ahead of every other method by more than the seeds' spread.",
                  "zh": "推荐：{best} —— 领先其他每个方法的幅度都超过种子间的波动。"},
    "rec.all_worse": {"en": " But every method ended below the {label} at this budget: none is worth training with as "
                            "it stands.",
                      "zh": "但在这个预算下，每个方法最终都低于 {label}：照现在这样，没有一个值得用来训练。"},
    "rec.none_above": {"en": " But no method ended above the {label} at this budget: none has shown it is worth "
                             "training with as it stands.",
                       "zh": "但在这个预算下，没有方法最终高于 {label}：照现在这样，没有一个显示出值得用来训练。"},
    "rec.no_steps": {"en": "{method}: trained 0 steps on {which}: its reference log-prob pass alone took longer than "
                           "{budget}, so its accuracy there is the {label}'s{ranked}. Raise --minutes (or lower "
                           "--samples, which sets how many pairs that pass scores) to compare it.",
                     "zh": "{method}：{which}训练了 0 步：单是参考模型的对数概率计算就超过了 {budget}，所以它在那里的"
                           "准确率就是 {label}的{ranked}。调大 --minutes（或调小 --samples，它决定这一步要算多少对）"
                           "才能比较它。"},
    "rec.every_seed": {"en": "every seed", "zh": "在所有种子上"},
    "rec.seeds": {"en": "seeds {seeds}", "zh": "在种子 {seeds} 上"},
    "rec.seed": {"en": "seed {seeds}", "zh": "在种子 {seeds} 上"},
    "rec.not_ranked": {"en": " and is not ranked", "zh": "，不参与排名"},
}
