"""English prose of `lmpo explain`. Keys are shared with `text_zh`; `{name}` fields are filled from
the method's settings (its preset), never typed here. Facts: ALGORITHMS.md in the shared notes."""

TEXT: dict[str, str] = {
    "word.pair": "pair",
    "word.std.sample": "sample (n−1)",
    "word.std.population": "population (n)",
    "heading.paper": "Paper",
    "paper.centering": " (centering)",
    "paper.k3_in_loss": " (k3 in the loss)",
    "paper.kl_in_reward": " (KL as a reward penalty)",
    "heading.commands": "Train with it",
    "heading.settings": "Preset settings",
    "heading.when": "When to choose it",
    "heading.formula": "Formula",
    "heading.example": "Worked example",
    "heading.diagrams": "Diagrams",
    "heading.given": "given",
    "heading.colon": ": ",
    "heading.provenance": "({text})",
    "heading.computed": "computed by {source}",
    "heading.methods": "Learn the methods",
    "heading.index_intro": ("Each page works one small example through the functions lmpo trains with "
                            "(`lmpo.algos`, called with the method's preset); every number on it is their output. "
                            "Regenerate with `lmpo explain --all --docs docs/methods`."),
    "heading.language": "中文",
    "heading.note_masked": "`·` marks a position the loss mask leaves out (padding or a tool's output).",
    "heading.note_push": "push: +1 where a gradient-descent step raises the token's log-probability, −1 where it lowers it.",
    # ---- methods: title, summary, when ----
    "grpo.title": "GRPO — Group Relative Policy Optimization",
    "grpo.summary": ("Sample a group of G completions per prompt, score each, and use the reward relative to the group "
                     "— normalised by the group's standard deviation — as the advantage of every token of the "
                     "completion. No value function is learned. The loss is PPO's clipped surrogate (ε {clip_eps_low}), "
                     "averaged per completion then over the group, plus β = {beta} times the k3 estimate of the KL "
                     "to the reference model."),
    "grpo.when": ("The default for tasks with a verifier (right or wrong answers): no critic to train, one reward per "
                  "completion. Its std normalisation makes small reward differences in easy or hard groups as loud "
                  "as large ones, and its per-completion mean weights tokens of short answers more; dr_grpo removes "
                  "both. Set β = 0 to drop the reference model and save its memory."),
    "dr_grpo.title": "Dr. GRPO — GRPO done right",
    "dr_grpo.summary": ("GRPO without its two biases: the advantage is the reward minus the group mean (no division by "
                        "the std), and token losses are summed and divided by a constant G·L_max instead of by each "
                        "completion's length, so every token weighs the same whatever the length of its answer."),
    "dr_grpo.when": ("Choose it over grpo when answers vary in length (GRPO's length normalisation lets wrong answers "
                     "grow long at little cost) or when rewards are graded rather than 0/1. No reference model."),
    "rloo.title": "RLOO — REINFORCE Leave-One-Out",
    "rloo.summary": ("Each completion's baseline is the mean reward of the other G−1 completions of its group, so the "
                     "baseline does not depend on the completion itself and the estimate stays unbiased. Rewards are "
                     "not divided by a std."),
    "rloo.when": ("A simple, unbiased group baseline, often on par with PPO at a fraction of the cost. For the same "
                  "group, its advantages are dr_grpo's times G/(G−1)."),
    "reinforce_pp.title": "REINFORCE++",
    "reinforce_pp.summary": ("Token-level REINFORCE with PPO's tricks and no critic: every token's reward is −β·k1 "
                             "(β = {beta}, the KL to the reference model as a penalty), plus the outcome reward on the "
                             "last token; returns are discounted sums (γ = {gamma}) and the advantages are these returns "
                             "whitened over the whole batch, not per group."),
    "reinforce_pp.when": ("When prompts are sampled once each (no groups) or groups are small, and you want a per-token "
                          "KL penalty in the reward as in classic RLHF, without training a value function."),
    "ppo.title": "PPO — Proximal Policy Optimization, with a critic (GAE)",
    "ppo.summary": ("The classic RLHF loop: a value function (critic) predicts each token's return; token rewards are "
                    "−β·k1 (β = {beta}) plus the outcome on the last token; GAE (γ = {gamma}, λ = {gae_lambda}) turns "
                    "rewards and values into advantages, which are whitened over the batch; the policy minimises the "
                    "clipped surrogate (ε {clip_eps_low}) and the critic a clipped squared error, over {num_iterations} "
                    "epochs × {num_minibatches} minibatches per batch."),
    "ppo.when": ("When rewards come per step or per turn (multi-turn agents, dense rewards) and a learned baseline "
                 "helps, or when you want the well-studied RLHF recipe. It costs a critic (memory and compute) and "
                 "more hyper-parameters than the group methods."),
    "gspo.title": "GSPO — Group Sequence Policy Optimization",
    "gspo.summary": ("GRPO's group advantages with the importance ratio taken per sequence: s_i is the geometric mean "
                     "of the token ratios of completion i, and the whole completion is clipped or not, with a very "
                     "narrow range (ε {clip_eps_low} / {clip_eps_high})."),
    "gspo.when": ("When token-level ratios are noisy — long completions, mixture-of-experts models whose routing "
                  "changes between the sampler and the trainer — and token-level clipping destabilises training."),
    "cispo.title": "CISPO — Clipped Importance-Sampling Policy Optimization",
    "cispo.summary": ("Instead of dropping the gradient of tokens whose ratio left the range, CISPO clips the "
                      "importance weight itself and keeps every token's gradient: ℓ = −sg(clip(r))·A·log π_θ. The "
                      "preset has no lower bound (ε_low = {clip_eps_low}) and an upper bound of 1 + {clip_eps_high}."),
    "cispo.when": ("When PPO's clipping throws away the gradient of rare but important tokens (e.g. reflective words "
                   "in long reasoning) — several minibatch updates per batch make this frequent."),
    "dapo.title": "DAPO — Decoupled Clip and Dynamic sAmpling Policy Optimization",
    "dapo.summary": ("GRPO with four changes: clip-higher (ε_low {clip_eps_low}, ε_high {clip_eps_high}) leaves more "
                     "room to raise unlikely tokens; dynamic sampling drops groups whose rewards are all equal; the "
                     "loss is a token mean over the batch; completions near the length limit get a soft penalty. "
                     "No KL term."),
    "dapo.when": ("Long reasoning with a verifier, where entropy collapses under symmetric clipping and many groups "
                  "are all right or all wrong. Dynamic sampling costs extra generation."),
    "dpo.title": "DPO — Direct Preference Optimization",
    "dpo.summary": ("Learns from pairs (prompt, chosen y_w, rejected y_l) without a reward model or sampling: the "
                    "implicit reward of a completion is β·(log π_θ − log π_ref), and the loss is the logistic loss on "
                    "the difference of the two implicit rewards (β = {beta})."),
    "dpo.when": ("When you have preference pairs, offline: the cheapest method here (no generation during training). "
                 "The loss keeps pushing the margin up, so it can over-fit; ipo and cdpo stop at a finite margin."),
    "ipo.title": "IPO — Identity Preference Optimization",
    "ipo.summary": ("A squared loss on the difference of token-averaged log-ratios, pulling it to the finite target "
                    "1/(2β) instead of to infinity (β = {beta})."),
    "ipo.when": "Preference pairs that are noisy or nearly deterministic, where DPO over-fits.",
    "simpo.title": "SimPO — Simple Preference Optimization",
    "simpo.summary": ("Reference-free: the implicit reward is the average log-probability of the completion times β, "
                      "and the loss asks the chosen reward to beat the rejected one by a margin γ "
                      "(β = {beta}, γ = {gamma} here, lmpo's defaults; the paper uses β of 2 to 2.5)."),
    "simpo.when": ("When memory is tight (no reference model) and length bias matters: averaging per token stops "
                   "longer answers winning by length. Set β and γ for it: lmpo's default β ({beta}) is the one DPO uses, far below the paper's 2 to 2.5."),
    "reward_model.title": "Reward model — Bradley–Terry",
    "reward_model.summary": ("A scalar head on a language model, read at the last real token, trained on preference "
                             "pairs so that the chosen answer scores higher: the probability that y_w beats y_l is "
                             "σ(r_w − r_l). Options: a margin m and a centering term c·(r_w + r_l)²."),
    "reward_model.when": ("When the task has no verifier but people (or a stronger model) can compare answers: train it, "
                          "then run PPO or GRPO on its scores (`lmpo pipeline --rl ppo_rm`). Watch for reward hacking."),
    "kl.title": "KL estimators — k1, k2, k3",
    "kl.summary": ("The KL divergence from the policy to the reference model cannot be summed over the vocabulary of "
                   "every continuation, so it is estimated from the sampled tokens. With κ = log π_ref − log π_θ at a "
                   "sampled token: k1 = −κ (unbiased, can be negative), k2 = κ²/2 (biased, low variance), "
                   "k3 = exp(κ) − 1 − κ (unbiased, never negative)."),
    "kl.when": ("GRPO adds β·k3 to the loss (the grpo preset: β = {grpo_beta}, as in DeepSeekMath); PPO-RLHF "
                "and REINFORCE++ subtract β·k1 from the token reward (the ppo preset: β = {ppo_beta}; reinforce_pp: "
                "β = {reinforce_pp_beta}). Many recent recipes set β = 0 and hold no reference model at all."),
    # ---- steps ----
    "step.advantages.grpo.title": "Group-normalised advantages",
    "step.advantages.grpo.text": ("Each completion's advantage is its reward minus the group mean, divided by the "
                                  "group's {std} standard deviation (plus eps = {advantage_eps}). Above the mean: positive; "
                                  "below: negative; the advantages of a group sum to zero."),
    "step.advantages.dr_grpo.title": "Advantages: reward minus the group mean",
    "step.advantages.dr_grpo.text": ("No division by the std: a group whose rewards barely differ gets small "
                                     "advantages, instead of advantages as large as any other group's."),
    "step.advantages.rloo.title": "Leave-one-out advantages",
    "step.advantages.rloo.text": ("Each completion is compared with the mean of the others. The group mean is shown for "
                                  "comparison: RLOO's advantage is (R_i − mean)·G/(G−1)."),
    "step.advantages.reinforce_pp.title": "Returns, then whitening over the batch",
    "step.advantages.reinforce_pp.text": ("The return of a token sums the rewards from it to the end (γ = {gamma}); the "
                                          "advantages are the returns minus their mean over all loss tokens of the batch, "
                                          "divided by their standard deviation."),
    "step.ratio.title": "Importance ratios per token",
    "step.ratio.text": ("After an update the policy π_θ differs from the policy π_old that sampled the batch. The ratio "
                        "r = π_θ/π_old of each token corrects for it; in the first update on a batch r = 1 exactly."),
    "step.ratio.gspo.title": "One ratio per sequence",
    "step.ratio.gspo.text": ("GSPO averages the token log-ratios of each completion and exponentiates: s_i is the "
                             "geometric mean of its token ratios, one number for the whole completion."),
    "step.policy_loss.ppo_clip.title": "Clipped surrogate per token",
    "step.policy_loss.ppo_clip.text": ("ℓ = −min(r·A, clip(r)·A) with the range [{low:g}, {high:g}]. A token is clipped "
                                       "(1 in `clipped`) when the ratio has left the range in the direction the advantage "
                                       "pushes: r > {high:g} with A > 0, or r < {low:g} with A < 0. Its loss is then "
                                       "constant and it gets no gradient; a ratio that moved the other way keeps its "
                                       "gradient (the minimum is pessimistic)."),
    "step.policy_loss.gspo.title": "Clipped surrogate per sequence",
    "step.policy_loss.gspo.text": ("The clipped surrogate on s_i with the range [1 − {clip_eps_low}, 1 + {clip_eps_high}], "
                                   "written on every token of the completion. A clipped completion gives no gradient "
                                   "to any of its tokens."),
    "step.policy_loss.cispo.title": "Clipped importance weight, gradient kept",
    "step.policy_loss.cispo.text": ("The weight sg(clip(r, {low:g}, {high:g})) is a constant; the gradient flows through "
                                    "log π_θ of every token, so `clipped` tokens still learn, with a capped weight."),
    "step.kl_in_loss.title": "KL to the reference, in the loss",
    "step.kl_in_loss.text": ("The preset adds β·{estimator} (β = {beta}) to every token's loss: it pulls the policy "
                             "back towards the reference model π_ref (the SFT model) where it has drifted."),
    "step.aggregation.seq_mean_token_mean.title": "Aggregation: mean per completion, then over completions",
    "step.aggregation.seq_mean_token_mean.text": ("Each completion's token losses are averaged, then the completions. A "
                                                  "token of a short completion weighs more than one of a long completion."),
    "step.aggregation.token_mean.title": "Aggregation: mean over all tokens of the batch",
    "step.aggregation.token_mean.text": ("Every loss token of the batch counts the same: long completions weigh in "
                                         "proportion to their length."),
    "step.aggregation.seq_mean_token_sum_norm.title": "Aggregation: token sum over a constant",
    "step.aggregation.seq_mean_token_sum_norm.text": ("The token losses are summed and divided by G·L_max with the constant "
                                                      "L_max = {max_len} (max_new_tokens), not by the lengths: every token "
                                                      "weighs the same and the length does not change the scale."),
    "step.gradient.title": "Gradient on each token",
    "step.gradient.text": ("Autograd through the registered functions gives ∂L/∂log π_θ for every token. Gradient descent "
                           "raises the log-probability of tokens with a negative gradient (push +1) and lowers the "
                           "others; {clipped}{kl}."),
    "step.gradient.clipped.ppo_clip": "clipped tokens get 0 from the policy term",
    "step.gradient.clipped.gspo": "every token of a clipped completion gets 0 from the policy term",
    "step.gradient.clipped.cispo": "clipped tokens still get a gradient from the policy term, with a capped weight",
    "step.gradient.clipped.kl": "; the KL term (β = {beta}) still moves them",
    "step.flat_group.title": "A group whose rewards are all equal",
    "step.flat_group.text": ("When every completion of a group gets the same reward, the estimator returns 0 for all, "
                             "so the policy term gives those tokens no gradient: the group costs generation and "
                             "teaches nothing."),
    "step.flat_group.kl.title": "A group whose rewards are all equal",
    "step.flat_group.kl.text": ("When every completion of a group gets the same reward, the estimator returns 0 for "
                                "all, so the policy term gives those tokens no gradient: the group costs generation and "
                                "teaches nothing. Only the KL term (β = {beta}) still acts on them."),
    "step.dynamic_sampling.title": "Dynamic sampling: keep the groups with signal",
    "step.dynamic_sampling.text": ("A batch of two groups; the second has all rewards equal, so it is dropped "
                                   "(keep = 0) and more prompts are sampled until the batch is full of groups with signal. "
                                   "The rest of the example uses the first group."),
    "step.overlong.title": "Soft overlong penalty",
    "step.overlong.text": ("Added to the reward, for completions longer than {start} tokens: from 0 at {start} down to −1 "
                           "at L_max = {max_len} (L_cache = {cache}). Shown on its own, with lengths of its own."),
    "step.kl_reward.title": "Token rewards with a KL penalty",
    "step.kl_reward.text": ("k1 = log π_old − log π_ref at every sampled token; each token's reward is −β·k1 "
                            "(β = {beta}), and the outcome reward R_i is added on the last token."),
    "step.kl_reward.ppo.title": "Token rewards with a KL penalty",
    "step.kl_reward.ppo.text": ("As in InstructGPT: every model token's reward is −β·k1 (β = {beta}), plus R on the last "
                                "model token. The first trajectory is multi-turn: its 3rd and 4th positions are a tool's "
                                "output (mask 0), which gets no reward and no loss but stays in the context."),
    "step.gae.title": "Generalized Advantage Estimation",
    "step.gae.text": ("The critic's values V_old (from the rollout) and the rewards give δ_t = r_t + γ·V_next − V_t, "
                      "and A_t sums the δ ahead with weights (γλ)^l (γ = {gamma}, λ = {lam}). 'Next' is the next model "
                      "token: the recursion skips the masked tool tokens, and the value after the last token is 0. "
                      "The returns G = A + V are the critic's targets."),
    "step.whiten.title": "Whitening over the batch",
    "step.whiten.text": "The advantages of all loss tokens of the batch are shifted to mean 0 and scaled to variance 1 (eps = {eps}).",
    "step.value_loss.title": "Clipped value loss",
    "step.value_loss.text": ("The critic's new values V are pulled to the returns; a value may not move more than "
                             "{clip} from V_old without losing its gradient (clipped = 1)."),
    "step.ppo_total.title": "Total loss",
    "step.ppo_total.text": "Both token losses are averaged over the batch's tokens; the value loss is weighted by c_v = {vf_coef}.",
    "step.gradient.ppo.title": "Gradients on the policy and on the critic",
    "step.gradient.ppo.text": ("One backward pass gives the policy's gradient per token (push as above) and the critic's "
                               "gradient per value; masked tool tokens get none."),
    "step.pairs.dpo.title": "The pairs",
    "step.pairs.dpo.text": "Three pairs: summed log-probabilities of the chosen and rejected completions under the policy and the reference.",
    "step.pairs.ipo.title": "The pairs",
    "step.pairs.ipo.text": "Three pairs, with their lengths: IPO averages the log-probabilities over the tokens.",
    "step.pairs.simpo.title": "The pairs",
    "step.pairs.simpo.text": "Three pairs, with their lengths; SimPO needs no reference model.",
    "step.implicit_rewards.dpo.title": "Implicit rewards and their margin",
    "step.implicit_rewards.dpo.text": ("β = {beta} times how much more likely the policy makes each completion than the "
                                       "reference does. The margin h is chosen minus rejected; acc = 1 where h > 0."),
    "step.implicit_rewards.ipo.title": "Implicit rewards per token and their margin",
    "step.implicit_rewards.ipo.text": "As DPO's, but each log-ratio is divided by the completion's length first (β = {beta}).",
    "step.implicit_rewards.simpo.title": "Implicit rewards: average log-probability",
    "step.implicit_rewards.simpo.text": "β = {beta} times the completion's mean token log-probability; no reference.",
    "step.loss.dpo.title": "The DPO loss",
    "step.loss.dpo.text": "−log σ(h) per pair: ln 2 at h = 0, small when the chosen reward is well ahead, large when behind.",
    "step.loss.ipo.title": "The IPO loss",
    "step.loss.ipo.text": ("(d − 1/(2β))² with d = margin/β: the loss is 0 at d = {target:g} and grows on both sides, "
                           "so pairs already far ahead are pulled back."),
    "step.loss.simpo.title": "The SimPO loss",
    "step.loss.simpo.text": "−log σ(margin − γ) with γ = {gamma}: a pair is pushed until its margin clearly exceeds γ.",
    "step.gradient.dpo.title": "Gradients on the log-probabilities",
    "step.gradient.dpo.text": ("Descent raises log π_θ(y_w) and lowers log π_θ(y_l), each by β·σ(−h)/B: pairs the "
                               "model already orders well get a small weight, wrongly ordered pairs a large one."),
    "step.gradient.ipo.title": "Gradients on the log-probabilities",
    "step.gradient.ipo.text": "The sign flips for a pair whose d is beyond the target: IPO lowers margins that are too large.",
    "step.gradient.simpo.title": "Gradients on the log-probabilities",
    "step.gradient.simpo.text": "Scaled by 1/|y|: the average, not the sum, of the log-probabilities is trained.",
    "step.bt_loss.title": "Bradley–Terry loss",
    "step.bt_loss.text": ("With lmpo's defaults m = {margin}, c = {center_coef}: −log σ(r_w − r_l) per pair; acc = 1 "
                          "where the chosen answer scores higher."),
    "step.gradient.reward_model.title": "Gradients on the scores",
    "step.gradient.reward_model.text": "Descent raises r_w and lowers r_l by the same amount, most for pairs ranked wrongly.",
    "step.bt_options.title": "With a margin and a centering term",
    "step.bt_options.text": ("m = {margin} asks the chosen answer to win by about m; c = {center_coef} adds c·(r_w + r_l)², "
                             "which pins the scores' mean near zero (Bradley–Terry alone leaves it free)."),
    "step.kl_tokens.title": "A policy and a reference over four tokens",
    "step.kl_tokens.text": "Their log-probabilities come from the logits through `token_logprobs`.",
    "step.kl_estimators.title": "The three estimates at each token",
    "step.kl_estimators.text": ("Each column is what one sampled token would give. k1 is negative where the reference "
                                "likes the token more than the policy; k2 and k3 are never negative."),
    "step.kl_expectations.title": "Their expectations under the policy",
    "step.kl_expectations.text": ("Weighted by π_θ, k1 and k3 average exactly to the true KL (both unbiased); k2 does "
                                  "not (biased), though it is close when the two distributions are close."),
    "step.kl_gradients.title": "Their gradients",
    "step.kl_gradients.text": ("What a token's log-probability receives when the estimate is a loss term: k1's is 1 "
                               "everywhere, k3's is 1 − π_ref/π_θ, which vanishes where the policy matches the reference."),
    # ---- diagrams ----
    "diagram.surrogate_grpo": ("The clipped surrogate ℓ and its gradient against the ratio r, for A > 0 and A < 0 "
                               "(ε {clip_eps_low}/{clip_eps_high}). Flat stretches are where clipping removes the gradient."),
    "diagram.surrogate_dr_grpo": "The clipped surrogate and its gradient against r, for A > 0 and A < 0 (ε {clip_eps_low}/{clip_eps_high}).",
    "diagram.surrogate_rloo": "The clipped surrogate and its gradient against r, for A > 0 and A < 0 (ε {clip_eps_low}/{clip_eps_high}).",
    "diagram.surrogate_reinforce_pp": "The clipped surrogate and its gradient against r, for A > 0 and A < 0 (ε {clip_eps_low}/{clip_eps_high}).",
    "diagram.surrogate_ppo": ("The clipped surrogate and its gradient against r, with the dual-clip variant: for A < 0 "
                              "and a very large ratio, dual-clip caps the loss at −c·A and removes the gradient."),
    "diagram.surrogate_gspo": ("GSPO's surrogate against the sequence ratio s: the range is "
                               "[1 − {clip_eps_low}, 1 + {clip_eps_high}], hundreds of times narrower than PPO's."),
    "diagram.surrogate_cispo": ("CISPO against PPO-clip (DAPO's range): CISPO's gradient never drops to 0, its weight "
                                "only stops growing at the bound; there is no lower bound."),
    "diagram.surrogate_dapo": ("Clip-higher against symmetric clipping: with A > 0 the ratio may rise to "
                               "1 + {clip_eps_high} before the gradient stops, leaving room for unlikely tokens."),
    "diagram.group_normalisation": ("The same three groups under grpo, dr_grpo and rloo. In the third group the rewards "
                                    "barely differ, yet grpo's std normalisation gives it advantages as large as the first "
                                    "group's; dr_grpo and rloo keep them small."),
    "diagram.zero_signal": ("Advantages and gradient per completion for a group with signal (blue) and one whose rewards "
                            "are all equal (red): zero advantage, zero gradient."),
    "diagram.aggregation": ("The weight of each token in the loss, for completions of 2, 4 and 8 tokens: seq_mean_token_mean "
                            "gives tokens of short completions more weight; token_mean and seq_mean_token_sum_norm do not."),
    "diagram.token_returns": ("REINFORCE++ on the example group: the return of each token (outcome reward and −β·k1, "
                              "β = {beta}) and the advantages after whitening over the batch."),
    "diagram.gae_masked": ("GAE (γ {gamma}, λ {lam}) along a multi-turn trajectory: grey positions are a tool's output "
                           "(mask 0). The recursion skips them and never reads their values."),
    "diagram.kl_estimators": ("k1, k2, k3 against κ = log π_ref − log π_θ, and their gradients. k3 ≥ 0 and ≈ k2 near 0; "
                              "k1 is linear and goes negative."),
    "diagram.preference_dpo": ("The DPO loss and ∂L/∂margin against the margin: the gradient fades as the chosen answer "
                               "pulls ahead but never reaches 0."),
    "diagram.preference_ipo": "The IPO loss against the margin: a parabola with its minimum at the target margin β·1/(2β) = 1/2.",
    "diagram.preference_simpo": "The SimPO loss against the margin: DPO's curve shifted right by γ = {gamma}.",
    "diagram.bradley_terry": "The Bradley–Terry loss and its gradient against r_w − r_l, without a margin and with m = {margin}.",
    # ---- values ----
    "value.rewards": "reward of each completion",
    "value.group_mean": "mean reward of the group",
    "value.advantages": "advantage",
    "value.old_logprobs": "log-prob under the sampling policy",
    "value.logprobs": "log-prob under the current policy",
    "value.log_ratio": "log-ratio",
    "value.ratio": "importance ratio",
    "value.seq_log_ratio": "mean log-ratio of the completion",
    "value.seq_ratio": "sequence ratio",
    "value.token_loss": "loss per token",
    "value.clipped": "clipped (1) or not (0)",
    "value.ref_logprobs": "log-prob under the reference",
    "value.kl": "KL estimate per token",
    "value.token_loss_kl": "loss per token, with the KL term",
    "value.loss": "loss",
    "value.grad": "gradient",
    "value.push": "direction of the update",
    "value.flat_rewards": "rewards, all equal",
    "value.flat_advantages": "advantages",
    "value.flat_grad": "gradient of the policy term",
    "value.batch_rewards": "rewards of a batch of two groups",
    "value.batch_groups": "group of each completion",
    "value.keep": "kept (1) or dropped (0)",
    "value.lengths": "completion length",
    "value.penalty": "penalty added to the reward",
    "value.k1": "k1 per token",
    "value.token_rewards": "reward per token",
    "value.returns": "return",
    "value.old_values": "value at sampling time",
    "value.gae_advantages": "GAE advantage (before whitening)",
    "value.values": "value now",
    "value.value_loss": "value loss per token",
    "value.value_clipped": "value clipped (1) or not (0)",
    "value.policy_loss": "policy loss",
    "value.critic_loss": "value loss",
    "value.value_grad": "gradient on the value",
    "value.chosen_logps": "log-prob of the chosen",
    "value.rejected_logps": "log-prob of the rejected",
    "value.ref_chosen_logps": "reference log-prob of the chosen",
    "value.ref_rejected_logps": "reference log-prob of the rejected",
    "value.chosen_lengths": "length of the chosen",
    "value.rejected_lengths": "length of the rejected",
    "value.chosen_reward": "implicit reward of the chosen",
    "value.rejected_reward": "implicit reward of the rejected",
    "value.margin": "margin",
    "value.accuracy": "ordered right (1) or not (0)",
    "value.pair_loss": "loss per pair",
    "value.grad_chosen": "gradient, chosen",
    "value.grad_rejected": "gradient, rejected",
    "value.chosen_scores": "score of the chosen",
    "value.rejected_scores": "score of the rejected",
    "value.demo_pair_loss": "loss per pair, with m and c",
    "value.policy_logits": "policy logits",
    "value.reference_logits": "reference logits",
    "value.probs": "policy probability",
    "value.k2": "k2",
    "value.k3": "k3",
    "value.exact_kl": "exact KL",
    "value.mean_k1": "expectation of k1",
    "value.mean_k2": "expectation of k2",
    "value.mean_k3": "expectation of k3",
    "value.grad_k1": "gradient of k1",
    "value.grad_k2": "gradient of k2",
    "value.grad_k3": "gradient of k3",
}
