"""The report in Chinese: the claims, criteria, key-number lines and notes of every claim, and the
report's own words. Same names, keys and {fields} as the English templates (a test checks it).
Each claim gives its technical terms in both languages once, in its own text."""

from __future__ import annotations

from lmpo.teach.factcheck.core import DEPENDS, ERROR, FAILS, HOLDS

UI_ZH = {
    "title": "lmpo 事实核查：业内反复流传的说法，逐条实测",
    "intro": "共 {claims}。每条都用 lmpo 自己的函数和训练器做一个小实验或一次精确计算来检验；结论按列出的判据由测得的数字"
             "算出，不是事先写好的。用时 {seconds:.0f} 秒，{threads} 个线程。图内的标注为英文：画图的机器上不能假定装有"
             "中文字体。",
    "claims_one": "1 条说法", "claims_many": "{n} 条说法",
    "table_title": "lmpo 事实核查 — {claims}，{seconds:.0f} 秒，{threads} 个线程",
    "claim": "说法", "verdict": "结论", "seconds": "秒", "criterion": "判据：", "source": "出处：",
    "key_numbers": "关键数字", "key_numbers_label": "关键数字：", "evidence": "全部测量值", "measure": "测量项", "value": "数值",
    "fast": "精确计算", "slow": "训练实验",
    "progress": "[factcheck] {i}/{n} {name}：{verdict}{error}，{seconds:.1f} 秒",
    "sft_start": "[factcheck] 为种子 {seed} 训练一次 SFT 起点（CPT → SFT，在空闲的双核 CPU 上约 70 秒；缓存在 {cache}）",
    "skipped_fast": "[factcheck] 已跳过 {names}：它们是训练实验，--fast 不运行训练实验",
    "start_trained": "（先训练了 SFT 起点：占总用时 {seconds:.0f} 秒；现已缓存）",
    "outputs": "报告：{html}  数据：{json}",
}
VERDICTS_ZH = {HOLDS: "成立", FAILS: "不成立", DEPENDS: "视情况而定", ERROR: "出错"}

CLAIMS_ZH: dict[str, dict] = {
    "grpo_no_critic": {
        "text": "GRPO 不需要价值网络（critic，也叫 value model）：组内平均奖励就是它的基线（baseline）。",
        "criterion": "用 lmpo 的 RL 训练器按流水线（pipeline）的 grpo 与 ppo 预设各训练一步，读取训练器自己记录的所持模型，"
                     "并统计其保存的参数量。若 grpo 没有构建价值网络而 ppo 构建了，则成立。",
        "summary": "grpo：{grpo_models} 个模型，{grpo_params:,} 个参数（价值网络 {grpo_critic_params:,}）；ppo：{ppo_models} 个模型，"
                   "{ppo_params:,} 个参数（价值网络 {ppo_critic_params:,}）",
        "notes": {
            "no_critic": "GRPO 只持有策略模型和（β > 0 时的）参考模型，共 {grpo_params:,} 个参数；PPO 另加一个 "
                         "{ppo_critic_params:,} 参数的价值网络。去掉它，参数少 {saving:.0%}。β = 0 时 GRPO 只持有策略模型本身。",
            "critic": "grpo 这次运行构建了价值网络（{grpo_critic_params:,} 个参数）。",
            "no_control": "ppo 也没有构建价值网络，这个计数说明不了问题。",
        },
    },
    "zero_var_no_gradient": {
        "text": "一组奖励完全相同（全对或全错）的样本，在 β = 0 时给出的策略梯度（policy gradient）为零；β > 0 时则不然。",
        "criterion": "对一组 {group_size:g} 个采样结果，经 lmpo 的 grpo 优势（advantage）、ppo_clip 损失、seq_mean_token_mean "
                     "聚合和 k3 做自动求导。若 β = 0 且奖励相同时梯度范数 ≤ {tol:g}，而 β > 0 且参考模型与策略不同时 > {tol:g}"
                     "（对照组：奖励不同时也须 > {tol:g}），则成立。",
        "summary": "‖g‖ β=0：{grad_beta0:.3g}；β={beta:g}，参考 = 策略：{grad_beta_ref_is_policy:.3g}；β={beta:g}，参考 ≠ 策略："
                   "{grad_beta_ref_differs:.3g}；奖励不同：{grad_mixed_rewards:.3g}",
        "notes": {
            "kl_only_when_moved": "β = 0 时梯度恰好为 {grad_beta0:g}：所有优势都是 0。β > 0 时只剩 KL 项在起作用，而且只有在策略偏离"
                                  "参考模型之后才有：参考模型与策略相同时（第一步）k3 的梯度也是 {grad_beta_ref_is_policy:.3g}。",
            "gradient_at_beta0": "奖励相同，β = 0 时仍有梯度 {grad_beta0:.3g}。",
            "no_kl_gradient": "β > 0 时 KL 项没有产生梯度（{grad_beta_ref_differs:.3g}）。",
            "no_control": "对照组（奖励不同）也没有梯度，这次测量说明不了问题。",
        },
    },
    "dpo_no_rm_no_sampling": {
        "text": "DPO 训练时既不需要奖励模型（reward model），也不需要采样（sampling）。",
        "criterion": "跑一次真实的 DPO 训练（流水线设置，256 个偏好对），统计 lmpo 的 generate 调用和奖励打分调用；贪心解码的评测调用"
                     "另计。若 DPO 没有任何采样调用和奖励调用，而对照组——两轮在线 DPO——两者都有（否则计数器本身无从验证），则成立。",
        "summary": "DPO（{dpo_steps} 步）：采样调用 {dpo_sampling_calls} 次，奖励调用 {dpo_reward_calls} 次，所持模型：{dpo_held}；"
                   "在线 DPO：采样调用 {online_sampling_calls} 次（{online_sampled_sequences} 条序列），奖励调用 "
                   "{online_reward_calls} 次，所持模型：{online_held}",
        "notes": {
            "offline": "DPO 在固定的偏好对上训练：没有采样一条序列，也没有打一次分；它只持有策略模型（参考模型的对数概率在训练前"
                       "一次算好）。它的 {dpo_greedy_calls} 次 generate 调用都是贪心的留出集评测。对照组在线 DPO 采样了 "
                       "{online_sampled_sequences} 条序列并为其打分。",
            "sampled": "DPO 进行了采样（{dpo_sampling_calls} 次）或奖励打分（{dpo_reward_calls} 次）。",
            "no_control": "对照组也没有采样或打分：计数器没有起作用。",
        },
    },
    "kl_estimators": {
        "text": "k3 = exp(κ) − 1 − κ 是 KL(π‖π_ref) 的无偏（unbiased）且永不为负的估计；k1 = log π − log π_ref 也无偏，但单个样本"
                "可能为负；k2 = κ²/2 有偏（biased）。",
        "criterion": "取四对 50 个词元上的类别分布，每对从 p 采样 {samples:,.0f} 次，用 lmpo 的 k1/k2/k3 与精确 KL 比较。若每一对上 k3 的"
                     "均值都落在精确 KL 的 {z:g} 个标准误以内、k3 从不小于 0、k1 的均值也落在 {z:g} 个标准误以内，并且有 k1 样本"
                     "小于 0，则成立。",
        "summary": "k3：最差 |z| {k3_max_z:.1f}，最小值 {k3_min:.3g}；k1：最差 |z| {k1_max_z:.1f}，最小值 {k1_min:.2f}，最多 "
                   "{k1_neg_share:.0%} 为负；k2：最差 |z| {k2_max_z:.0f}（最远的一对：{far_k2:.3f}，而 KL 为 {far_exact:.3f}）",
        "notes": {
            "k2_biased": "k1 和 k3 的均值都等于精确 KL；k1 在最多 {k1_neg_share:.0%} 的样本上为负，k3 从不为负。k2 有偏：最远的一对上"
                         "为 {far_k2:.3f}，精确值 {far_exact:.3f}；最近的一对上为 {close_k2:.4f}，精确值 {close_exact:.4f}"
                         "（π ≈ π_ref 时偏差很小）。",
            "k2_not_biased": "k1 和 k3 的均值都等于精确 KL；k1 在最多 {k1_neg_share:.0%} 的样本上为负，k3 从不为负；在这个样本量下"
                             "测不出 k2 的偏差。",
            "k3_off": "k3 偏离了精确 KL（最差 |z| {k3_max_z:.1f}）或小于 0（{k3_min:.3g}）。",
            "k1_off": "k1 偏离了精确 KL：最差 |z| {k1_max_z:.1f}，所以在这里它不是无偏的。",
            "k1_never_negative": "没有一个 k1 样本为负。",
        },
    },
    "one_update_no_clipping": {
        "text": "每批采样只做一次优化更新时，重要性比率（importance ratio）恒为 1，裁剪（clipping）从不触发，更新就是普通的策略梯度。",
        "criterion": "(1) 精确计算：在随机批次上令 π_θ = π_old，调用 lmpo 的 ppo_clip：若没有任何词元被裁剪，且梯度与 −A·∇log π "
                     "之差 ≤ {tol:g}，则成立。(2) SFT 模型的采样：|π_训练器/π_采样器 − 1| ≤ {ratio_tol:g}。(3) 一次真实的 GRPO 训练"
                     "（每批一次更新）：每一步的裁剪比例都是 0；而每批 4 次更新的对照训练必须出现裁剪（否则这项检查不可能失败）。",
        "summary": "精确计算：裁剪 {exact_clipped:g} 个，梯度差 {exact_grad_gap:.2g}；采样上最大 |r−1| {sampler_ratio_gap:.2g}；GRPO "
                   "训练 {run_steps} 步中最大裁剪比例 {run_clip_max:g}；对照组（每批 {control_updates} 次更新）{control_clip_mean:.3f}",
        "notes": {
            "on_policy": "同策略（on-policy）时比率在浮点舍入范围内等于 1（{sampler_ratio_gap:.2g}），根本碰不到裁剪区间：裁剪比例 "
                         "{run_clip_max:g}。裁剪只在同一批的第二次更新起才起作用（对照组：{control_clip_mean:.1%} 的词元被裁剪）"
                         "——clip-higher 也一样。",
            "clipped": "同策略时出现了裁剪（精确计算 {exact_clipped:g}，训练中最大 {run_clip_max:g}），或比率偏离 1 达 "
                       "{sampler_ratio_gap:.2g}。",
            "never_clips": "同策略时没有裁剪，但异策略的对照组也从未裁剪。",
        },
    },
    "length_bias_aggregation": {
        "text": "先在每条序列内对词元（token）损失取平均、再对序列取平均——原始 GRPO 的聚合方式（aggregation）——会带来长度偏差"
                "（length bias）：长回答的每个词元得到的梯度比短回答的少。",
        "criterion": "对长度 1–{max_len:g}、优势相同的回答，经 lmpo 的 ppo_clip 和各聚合方式自动求导。离散度 = L = 1 时每词元梯度除以 "
                     "L = {max_len:g} 时的。若 seq_mean_token_mean 的离散度大于 1 + {margin:g}，而 token_mean 与 "
                     "seq_mean_token_sum_norm 的离散度在 {tol:g} 以内等于 1，则成立。",
        "summary": "每词元梯度离散度（L=1 / L={max_len}）：seq_mean_token_mean {spread_seq_mean_token_mean:.1f}×，token_mean "
                   "{spread_token_mean:.2f}×，seq_mean_token_sum_norm {spread_seq_mean_token_sum_norm:.2f}×",
        "notes": {
            "biased": "在 seq_mean_token_mean 下每条序列得到的总推力相同，再摊到各个词元上：1 个词元的回答每词元得到 "
                      "{short_token:.4f}，{max_len} 个词元的回答每词元只有 {long_token:.4f}。于是长的错误回答每词元受罚更轻，"
                      "短的正确回答每词元受奖更多，错误回答会越写越长。token_mean 和 Dr. GRPO 的常数归一化对每个词元一视同仁。",
            "not_biased": "seq_mean_token_mean 对各种长度的词元权重相同（离散度 {spread_seq_mean_token_mean:.3f}）。",
            "all_biased": "所有聚合方式都按长度给词元加权。",
        },
    },
    "reference_no_gradient": {
        "text": "参考模型（reference model）不接收梯度：它始终就是起点模型。",
        "criterion": "取 lmpo 的 RL 训练器在上面 β > 0 那次训练中构建的参考模型（从 `Run.reference` 截获）。若它没有一个参数需要梯度、"
                     "训练后没有一个参数带 .grad、其权重与 SFT 检查点相差不超过 {tol:g}，而策略模型的权重确实变了，则成立。",
        "summary": "参考模型 {reference_params} 个张量：{reference_requires_grad} 个需要梯度，{reference_grads} 个带 .grad，最大变化 "
                   "{reference_max_change:.3g}；{steps} 步后策略最大变化 {policy_max_change:.3g}",
        "notes": {
            "frozen": "在 β = {beta:g} 下训练 {steps} 步后，策略权重最多变化 {policy_max_change:.3g}；参考模型变化 "
                      "{reference_max_change:g}，而且从未持有梯度。",
            "moved": "参考模型可能被训练或发生了变化：{reference_requires_grad} 个张量需要梯度，{reference_grads} 个带梯度，最大变化 "
                     "{reference_max_change:.3g}。",
            "policy_still": "策略模型也没有变化，这次训练说明不了问题。",
        },
    },
    "gspo_geometric_mean": {
        "text": "GSPO 的序列级比率是各词元比率的几何平均（geometric mean），即 (Π_t r_t)^(1/L)。",
        "criterion": "在 16 行随机数据（长度 1–12，float64）上，取 A = 1、不裁剪，用 lmpo 的 gspo 和 gspo_token 损失与直接算出的 "
                     "(Π_t r_t)^(1/L) 比较。若最大相对误差 ≤ {tol:g}，则成立。",
        "summary": "最大相对误差 gspo {gspo_rel_error:.2g}，gspo_token {gspo_token_rel_error:.2g}；比率的算术平均 − 几何平均："
                   "{am_gm_min:.2g} … {am_gm_gap:.2g}",
        "notes": {
            "geometric": "s_i = exp(mean_t ρ_t) 就是几何平均；这里它比词元比率的算术平均最多低 {am_gm_gap:.3f}，个别极端词元对它的"
                         "影响也更小。",
            "not_geometric": "序列比率与几何平均最多相差 {gspo_rel_error:.3g}。",
        },
    },
    "beta_keeps_close": {
        "text": "β 越大，策略离参考模型（reference model）越近。",
        "criterion": "从 SFT 起点做两次只有 β 不同的 GRPO 训练（流水线预设，{steps:g} 步）；然后对 500 个留出问题各采样一条，在整个词表上"
                     "计算精确的每词元 KL(π‖π_ref)。若较大 β 的 KL 低出 {z:g} 个标准误以上且低出 {margin:.0%} 以上，则成立；若高出 {z:g} "
                     "个标准误以上，则不成立。",
        "summary": "KL β={beta_low:g}：{kl_low:.3f}±{se_low:.3f}，β={beta_high:g}：{kl_high:.3f}±{se_high:.3f} 奈特/词元；留出集准确率 "
                   "{acc_low:.1%} 对 {acc_high:.1%}（SFT {acc_start:.1%}）",
        "notes": {
            "closer": "β = {beta_high:g} 结束时离参考模型 {kl_high:.3f} 奈特/词元，β = {beta_low:g} 为 {kl_low:.3f}（相差 "
                      "{kl_diff_se:.1f} 个标准误）；留出集准确率 {acc_high:.1%} 对 {acc_low:.1%}。",
            "farther": "较大的 β 反而离参考模型更远（{kl_high:.3f} 对 {kl_low:.3f}）。",
            "no_difference": "两次训练结束时距离相近（{kl_high:.3f} 对 {kl_low:.3f}，{kl_diff_se:.1f} 个标准误）：在这个训练量下 β 的"
                             "影响测不出来。",
        },
    },
    "dynamic_sampling_signal": {
        "text": "动态采样（dynamic sampling：丢掉奖励全相同的组，再多采一些）能提高带有学习信号的组所占的比例。",
        "criterion": "用 RL 训练器自己的 `collect`，分别关闭和开启 dynamic_sampling，各收集 10 批（8 个提示 × 8 个样本），起点分别是 "
                     "SFT 模型和经 GRPO 训练后的模型。若两个起点上，批内奖励有差异的组所占比例都提高 {margin:.0%} 以上，则成立；只在其中"
                     "一个起点提高，则视情况而定；若比例反而下降，则不成立。",
        "summary": "SFT（{acc_start:.0%}）：{share_off_start:.0%} → {share_on_start:.0%}，采样组数为 {cost_on_start:.2f} 倍；训练后"
                   "（{acc_trained:.0%}）：{share_off_trained:.0%} → {share_on_trained:.0%}，为 {cost_on_trained:.2f} 倍",
        "notes": {
            "raised": "开启后参与训练的每一组都带有信号；代价是 SFT 起点采样量为 {cost_on_start:.2f} 倍（那里只有 "
                      "{share_off_start:.0%} 的组有信号），GRPO 训练后为 {cost_on_trained:.2f} 倍（{share_off_trained:.0%}）："
                      "约为「有信号组所占比例」的倒数，有信号的组越少，代价越高。",
            "base_rate": "只有在很多组全对或全错时才有帮助：起点 {share_off_start:.0%} → {share_on_start:.0%}，训练后 "
                         "{share_off_trained:.0%} → {share_on_trained:.0%}。取决于准确率（以及组的大小）。",
            "nothing_to_raise": "几乎每一组本来就有信号（{share_off_start:.0%}、{share_off_trained:.0%}）：在这样的准确率下无可提高。",
            "lower": "开启动态采样后比例反而下降。",
        },
    },
    "clip_higher_entropy": {
        "text": "上限放宽的裁剪（clip-higher：ε_high = 0.28 > ε_low = 0.2）能减缓熵坍缩（entropy collapse）。",
        "criterion": "GRPO 训练（流水线预设，β = 0，每批 4 次更新，使裁剪真正起作用），ε_high 取 0.2 和 0.28，各用两个随机种子，"
                     "{steps:g} 步。熵取最后三分之一步数的平均。若基线的熵比最初十分之一步的下降不超过 {margin:.0%}（没有坍缩可减缓），"
                     "则视情况而定。若每个种子下 clip-higher 的熵都高出 {margin:.0%} 以上，则成立；若每个种子下都低出 "
                     "{margin:.0%} 以上，则不成立；否则视情况而定。",
        "summary": "熵（最后三分之一）ε_high 0.2 → 0.28：种子 {seed_1} {entropy_base_1:.3f} → {entropy_high_1:.3f}，种子 {seed_2} "
                   "{entropy_base_2:.3f} → {entropy_high_2:.3f}（比值 {ratio_min:.2f}–{ratio_max:.2f}）；裁剪比例 {clip_base:.3f}",
        "notes": {
            "slower": "两个种子下 clip-higher 都保住了 {ratio_mean:.2f} 倍的熵。但前提是每批不止一次更新：lmpo 的 dapo 预设每批只做 "
                      "{dapo_updates_per_batch:g} 次更新，那时没有任何词元被裁剪。",
            "faster": "两个种子下 clip-higher 结束时熵都更低（×{ratio_mean:.2f}）。",
            "within_noise": "各种子间熵的比值为 {ratio_min:.2f}–{ratio_max:.2f}：在这个规模（{steps} 步、100 万参数；初始熵 "
                            "{entropy_start:.3f}）下没有一致的效果。而每批只更新一次时（lmpo 的 dapo 预设：{dapo_updates_per_batch:g}）"
                            "裁剪根本不起作用。",
            "never_clipped": "没有任何词元被裁剪，ε_high 不可能有影响。",
            "no_collapse": "没有什么可减缓的：{steps} 步内基线的熵并没有坍缩（最初十分之一步 {entropy_start:.3f}，最后三分之一 "
                           "{entropy_base_end:.3f} 奈特/词元）。各种子下 clip-higher 与它的比值为 {ratio_min:.2f}–{ratio_max:.2f}。"
                           "而每批只更新一次时（lmpo 的 dapo 预设：{dapo_updates_per_batch:g}）裁剪根本不起作用。",
        },
    },
    "reward_model_hacking": {
        "text": "学出来的奖励模型（reward model）会被钻空子（reward hacking），而对没有结束符（EOS）的回答加惩罚能堵住其中一个漏洞。",
        "criterion": "先用 lmpo 的训练器训练奖励模型（{rm_pairs:,.0f} 个偏好对，1 轮），再从 SFT 起点只以它的打分做 GRPO（β = {beta:g}），"
                     "{steps:g} 步，"
                     "分别不加和加缺失 EOS 惩罚。被钻空子 = lmpo 的诊断工具（doctor）报出 reward_hacking（奖励上升 ≥ 0.1，同时留出集准确率"
                     "下降 ≥ 5 个百分点）。漏洞 = 在 200 个留出问题中，奖励模型给「正确答案后接无 EOS 的胡乱续写」打分高于「以 EOS "
                     "结尾的正确答案」的比例。若不加惩罚的训练被钻空子、漏洞是开着的（> {share:g}）、惩罚把它堵上（≤ {share:g}），则成立。",
        "summary": "奖励模型成对准确率 {rm_accuracy:.1%}；不加惩罚：奖励模型打分 {plain_rm_first:.2f} → {plain_rm_last:.2f}，验证器准确率 "
                   "{plain_acc_first:.0%} → {plain_acc_last:.0%}，留出集 {plain_heldout_first:.1%} → {plain_heldout_last:.1%}，无 EOS 被截断 "
                   "{plain_truncated:.0%}；加惩罚：留出集 → {eos_heldout_last:.1%}，被截断 {eos_truncated:.0%}；胡乱续写在 {probe_open:.0%} 的问题上得分更高，加惩罚后 {probe_closed:.0%}",
        "notes": {
            "closed": "优化奖励模型的打分，使其从 {plain_rm_first:.2f} 升到 {plain_rm_last:.2f}，而验证器在同一批样本上的准确率从 "
                      "{plain_acc_first:.0%} 降到 {plain_acc_last:.0%}，留出集准确率从 {plain_heldout_first:.1%} 降到 "
                      "{plain_heldout_last:.1%}；到最后有 {plain_truncated:.0%} 的回答一直写到长度上限。奖励模型在 {probe_open:.0%} "
                      "的问题上偏爱这种没有结束的胡乱续写，胜过正确答案；{penalty:g} 的惩罚堵住了这个漏洞（{probe_closed:.0%}；"
                      "被截断：{eos_truncated:.0%}），加惩罚的训练也没有被报出问题（留出集 {eos_heldout_last:.1%}）。",
            "hacked_elsewhere": "优化奖励模型的打分，使其从 {plain_rm_first:.2f} 升到 {plain_rm_last:.2f}，而验证器在同一批样本上的"
                                "准确率从 {plain_acc_first:.0%} 降到 {plain_acc_last:.0%}。{penalty:g} 的惩罚堵住了缺失 EOS 的漏洞（胡乱续写"
                                "在 {probe_open:.0%} 的问题上得分更高，加惩罚后 {probe_closed:.0%}），但加惩罚的训练同样被钻了空子，这次靠"
                                "的是正常结束却错误的答案（被截断的比例：{eos_truncated:.0%}）：它只堵住一个漏洞，而不是全部。",
            "not_hacked": "{steps:g} 步内没有被钻空子（doctor 没有报出 reward_hacking）；可能需要更多训练。",
            "no_eos_hole": "策略钻了奖励模型的空子，但这个奖励模型从不偏爱没有结束的胡乱续写（{probe_open:.0%}）：在这里惩罚没有"
                           "漏洞可堵。",
            "still_open": "即使加了惩罚，胡乱续写仍在 {probe_closed:.0%} 的问题上得分高于正确答案。",
        },
    },
    "online_beats_offline_dpo": {
        "text": "在偏好对（preference pair）数量相同时，在线 DPO（online DPO：从当前策略采样并排序成对）胜过离线 DPO（offline DPO）。",
        "criterion": "先做在线 DPO（流水线设置，{rounds:g} 轮，由验证器排序成对），再在任务自带的固定偏好对上做离线 DPO，对数与在线 DPO "
                     "实际训练的相同；比较 500 个留出问题上的贪心准确率。若在线比离线高出差值的 {z:g} 个标准误以上，则成立；若低出同样"
                     "多，则不成立；否则视情况而定。",
        "summary": "各 {pairs} 个偏好对：在线 {acc_online:.1%}，离线 {acc_offline:.1%}（SFT {acc_start:.1%}）；差值 {diff:+.1%} = "
                   "{diff_se:+.1f} 个标准误",
        "notes": {
            "online_better": "同样 {pairs} 个偏好对，在线 DPO 达到 {acc_online:.1%}，离线为 {acc_offline:.1%}：在线的偏好对就是策略"
                             "自己犯的错，再由验证器排序。",
            "offline_better": "离线 DPO 更好（{acc_offline:.1%} 对 {acc_online:.1%}）：为这个任务专门写的固定偏好对（差一点就对的"
                              "错误答案），每对教得比策略自己的样本更多。",
            "tie": "在线 {acc_online:.1%} 对离线 {acc_offline:.1%}，{diff_se:+.1f} 个标准误：在 {pairs} 个偏好对、单个种子下无法区分。"
                   "取决于离线偏好对的质量，以及策略偏离它们有多远。",
        },
    },
    "rloo_leave_one_out": {
        "text": "RLOO 的留一法（leave-one-out）优势在每组内求和为零，并且等于均值基线优势的 K/(K−1) 倍。",
        "criterion": "在 2–16 个样本一组的随机奖励上（float64）运行 lmpo 的 rloo 和 dr_grpo（均值基线）。若每组的和以及最大的 "
                     "|A_rloo − K/(K−1)·A_mean| 都 ≤ {tol:g}，则成立。",
        "summary": "最大 |组内和| {max_group_sum:.2g}；最大倍数误差 {max_scale_error:.2g}；0.9,0.6,0.2,0.0 → {example_first:.5f} = "
                   "4/3 × {example_mean_baseline:.3f}",
        "notes": {
            "identity": "R_i − mean_{{j≠i}} R_j = (K/(K−1))·(R_i − mean_j R_j)：RLOO 就是把均值基线放大 K/(K−1) 倍，所以两者组内和都为零。",
            "broken": "恒等式不成立：最大组内和 {max_group_sum:.3g}，倍数误差 {max_scale_error:.3g}。",
        },
    },
    "grpo_std_upweights": {
        "text": "GRPO 除以组内标准差（standard deviation）会放大低方差组的权重：几乎总答对或几乎总答错的题。",
        "criterion": "8 个二值奖励一组，其中 k = 1…7 个正确；grpo 相对 dr_grpo（同样的优势但不除以标准差）的放大倍数为 "
                     "Σ|A_grpo| / Σ|A_dr_grpo|。若 k = 1 和 k = 7 时的倍数都比 k = 4 时高出 {margin:.0%} 以上，则成立。",
        "summary": "放大倍数 k=1：{mult_k1:.2f}，k=4：{mult_mid:.2f}，k=7：{mult_k7:.2f}；唯一正确答案的 A：{rare_right_grpo:.2f}（grpo）"
                   "对 {rare_right_dr:.3f}（dr_grpo）",
        "notes": {
            "upweights": "除以标准差后，8 中对 1 的组优势被放大 {mult_k1:.2f} 倍，8 中对 4 的组只放大 {mult_mid:.2f} 倍：那个难得的"
                         "正确答案得到 A = {rare_right_grpo:.2f}。",
            "downweights": "极端组的放大倍数反而小于均衡组。",
            "flat": "放大倍数几乎不随 k 变化。",
        },
    },
    "ppo_clip_lower_bound": {
        "text": "PPO 的裁剪目标 min(r·A, clip(r)·A) 是未裁剪目标 r·A 的悲观下界（pessimistic lower bound）。",
        "criterion": "在比率 0.3–1.7、优势 ±0.5、±1、±2 上运行 lmpo 的 ppo_clip（ε = 0.2）。若裁剪目标从不超过 r·A（容差 {tol:g}）、"
                     "在 [1−ε, 1+ε] 内与之相等、并在某处（裁剪生效处）严格低于它，则成立。",
        "summary": "max(裁剪目标 − r·A) = {max_excess:.2g}；区间内最大差 {max_gap_inside:.2g}；{points} 个点中有 {binding_points} 个裁剪生效",
        "notes": {
            "lower_bound": "裁剪目标从不高于 r·A；它只在变化会带来好处的地方变平（A > 0 且 r > 1+ε；A < 0 且 r < 1−ε），所以坏的一步"
                           "永远不会被掩盖。",
            "above": "裁剪目标超过了 r·A，超出 {max_excess:.3g}。",
        },
    },
    "dpo_weight_sigmoid": {
        "text": "DPO 给每个偏好对的梯度乘上权重 σ(−h)，即隐式奖励模型（implicit reward model）把这一对排错的程度。",
        "criterion": "对间隔（margin）h 从 −8 到 8（β = 0.1）的 lmpo dpo 损失自动求导。若 −(∂loss/∂log π(y_w))/β 处处与 σ(−h) 相差 "
                     "≤ {tol:g}，则成立。",
        "summary": "max |权重 − σ(−h)| = {max_error:.2g}；h = −5 时权重 {weight_at_m5:.3f}，0 时 {weight_at_0:.3f}，5 时 {weight_at_5:.4f}",
        "notes": {
            "sigmoid": "排错 5 奈特的一对权重为 {weight_at_m5:.3f}，排对 5 奈特的一对只有 {weight_at_5:.4f}：已经排对的偏好对，DPO "
                       "推得越来越轻，权重逐渐变小，但永远不会到 0。",
            "not_sigmoid": "权重与 σ(−h) 最多相差 {max_error:.3g}。",
        },
    },
    "ipo_target_margin": {
        "text": "IPO 的损失在有限的间隔（margin）1/(2τ) 处取最小值，而 DPO 的损失随间隔增大一直下降。",
        "criterion": "对 τ = 0.1、0.5、1，在 1/(2τ) 两侧 ±2、步长 0.001 的网格上计算 lmpo 的 ipo 损失（按词元平均的对数比率，τ = β），"
                     "并在 1/(2τ) 处自动求导。若那里的梯度 ≤ {tol:g}，且网格最小值与 1/(2τ) 相差不超过 {grid:g}，则成立。",
        "summary": "1/(2τ) 处 |∂loss/∂d|：{max_grad_at_target:.2g}；网格最小值最多偏离 {max_argmin_error:.2g}；目标 {target_small:g}、"
                   "{target_mid:g}、{target_large:g}；DPO 损失 h = 5 时 {dpo_loss_h5:.4f}，h = 10 时 {dpo_loss_h10:.6f}",
        "notes": {
            "finite_target": "IPO 把间隔拉向 1/(2τ)（τ = 0.1 时为 {target_small:g}），超过了就往回推；DPO 的损失在 h = 5 到 10 之间仍从 "
                             "{dpo_loss_h5:.4f} 降到 {dpo_loss_h10:.6f}，所以在可分的偏好对上它会无止境地推大间隔。",
            "elsewhere": "IPO 的最小值不在 1/(2τ)（梯度 {max_grad_at_target:.3g}，最小值位置偏离 {max_argmin_error:.3g}）。",
        },
    },
    "k3_loss_minimises_kl": {
        "text": "像 GRPO 那样把 β·k3 加进损失，就是在最小化 KL(π‖π_ref)：k3 是它的无偏估计，所以 k3 的梯度就是这个 KL 的梯度"
                "（反向 KL，reverse KL）。",
        "criterion": "取四对 50 个词元上的类别分布：对从 π 采样的词元，精确计算把 lmpo 的 k1/k2/k3/k3_ratio 当作损失时的期望梯度"
                     "（和 RL 损失一样，经采样词元的 log π 求导），并与精确的 KL(π‖π_ref) 和 KL(π_ref‖π) 的自动求导梯度比较。若每一对上 "
                     "k3 的梯度与反向 KL 的梯度相对误差都在 {tol:g} 以内，则成立。",
        "summary": "与 ∇KL(π‖π_ref) 的相对差距：k3 最多 {k3_vs_reverse:.2f}（最近的一对 {close_k3_vs_reverse:.3f}），k2 "
                   "{k2_vs_reverse:.1g}，k3_ratio {k3_ratio_vs_reverse:.1g}；k3 与 ∇KL(π_ref‖π)：{k3_vs_forward:.1g}；k1 的期望梯度 "
                   "{k1_norm:.1g}",
        "notes": {
            "forward": "k3 对 KL(π‖π_ref) 的估计是无偏的，但把它当损失时，梯度却是正向 KL（forward KL）即 KL(π_ref‖π) 的梯度（差距 "
                       "{k3_vs_forward:.1g}），与反向 KL 的梯度最多相差 {k3_vs_reverse:.0%}；π 越接近 π_ref 差距越小（最近的一对上为 "
                       "{close_k3_vs_reverse:.0%}，KL {close_kl:.3f}）。同策略时，k2 和 k3_ratio 给出的才是反向 KL 的梯度；k1 的期望"
                       "梯度为零。",
            "reverse": "k3 作为损失的梯度与反向 KL 的梯度一致（差距 {k3_vs_reverse:.2g}）。",
            "neither": "k3 作为损失的梯度与两种 KL 都不一致（差距 {k3_vs_reverse:.3g}、{k3_vs_forward:.3g}）。",
        },
    },
    "rl_sharpens_not_widens": {
        "text": "用可验证奖励（verifiable reward）做 RL 只是让分布更尖锐（sharpen），并没有拓宽（widen）模型的能力：它让正确答案更可能"
                "被采到（pass@1 上升），但在 k 很大时，基础模型（base model）能解出的题一样多甚至更多。",
        "criterion": "在 200 道留出题上，用 lmpo 自己的评估，对三个模型各采 64 个样本（温度 1），用无偏估计量算 pass@k（k = 1 … 64）："
                     "基础模型（CPT 之后、任何后训练之前）、RL 的起点 SFT 模型，以及从它出发的一次 GRPO 训练（流水线预设，β = 0）。"
                     "若 GRPO 的 pass@1 比基础模型高出 {margin:.0%} 以上，而它的 pass@64 比基础模型高出不超过 {margin:.0%}，则成立；"
                     "若 pass@64 高出更多，则不成立；若 pass@1 没有提高，则视情况而定。",
        "summary": "pass@1 / pass@64：基础模型 {base_pass1:.0%} / {base_pass64:.1%}；SFT {sft_pass1:.0%} / {sft_pass64:.1%}；"
                   "GRPO {rl_pass1:.0%} / {rl_pass64:.1%}",
        "notes": {
            "sharpened": "GRPO 把 pass@1 从 {base_pass1:.0%}（基础模型）提高到 {rl_pass1:.0%}，pass@64 却没有：k = 64 时，"
                         "基础模型解出 {base_pass64:.1%} 的题，GRPO 为 {rl_pass64:.1%}。把哪个模型当作「基础」决定了答案：相对于它的 "
                         "SFT 起点——示范数据让样本变窄了（pass@64 为 {sft_pass64:.1%}）——GRPO 是拓宽了的。",
            "sharpened_only": "GRPO 把 pass@1 从 {base_pass1:.0%}（基础模型）提高到 {rl_pass1:.0%}，pass@64 却没有提高：既没有超过基础模型"
                              "（{base_pass64:.1%}，GRPO 为 {rl_pass64:.1%}），也没有超过它的 SFT 起点（{sft_pass64:.1%}）。",
            "widened": "GRPO 的 pass@64（{rl_pass64:.1%}）高于基础模型（{base_pass64:.1%}）：在这里，RL 学会了基础模型 64 次采样都"
                       "采不到的答案。",
            "no_sharpening": "GRPO 没有提高 pass@1（{rl_pass1:.0%}，基础模型 {base_pass1:.0%}）：没有变尖锐，也就无从比较。",
        },
    },
}
