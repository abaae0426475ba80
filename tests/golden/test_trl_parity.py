"""lmpo against values computed by TRL's own trainer code (tests/golden/trl_golden.json).

Each golden case holds TRL's config, the fixed inputs and TRL's outputs (see trl_generate.py,
which runs in the TRL environment; this test needs no TRL). The TRL config is mapped to lmpo
options by the rows of docs/porting.md (`grpo_options`, `rloo_options`, `dpo_options`), and lmpo
computes the same quantity through the code its trainers train with: `rl_update.update` for the
RL losses, `rl_batch.compute_advantages` for advantages, `preference.preference_step` for the
preference losses; only the model forward is replaced by the fixed log-probs. Values and
gradients with respect to the per-token log-probs must agree to 1e-6. A case marked
`expected_difference` is a documented difference: its test checks the difference is the one
docs/porting.md describes.
"""

from __future__ import annotations

import functools
import json
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lmpo.algos import POLICY_LOSSES, PREFERENCE_LOSSES
from lmpo.algos.aggregation import seq_mean_token_mean
from lmpo.algos.kl import k3
from lmpo.models.logprobs import TokenOutputs
from lmpo.trainers import preference as pref
from lmpo.trainers import rl_update
from lmpo.trainers.distributed import Distributed
from lmpo.trainers.harness import Updater
from lmpo.trainers.preference import EncodedPairs, PreferenceConfig, preference_options
from lmpo.trainers.rl_batch import Batch, Scored, compute_advantages
from lmpo.trainers.rl_config import RLConfig
from lmpo.trainers.runtime import options_for

GOLDEN = Path(__file__).with_name("trl_golden.json")
TOL = 1e-6
F64 = torch.float64


@functools.cache
def golden() -> dict:
    if not GOLDEN.exists():
        pytest.fail(f"{GOLDEN} is missing: run tests/golden/trl_generate.py in the TRL environment")
    return json.loads(GOLDEN.read_text())


def case_names() -> list[str]:
    return sorted(json.loads(GOLDEN.read_text())["cases"]) if GOLDEN.exists() else []


def t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


def close(actual: torch.Tensor | float, expected, what: str) -> None:
    actual, expected = torch.as_tensor(actual, dtype=F64), torch.as_tensor(expected, dtype=F64)
    gap = (actual - expected).abs().max().item()
    assert gap <= TOL, f"{what}: lmpo {actual.tolist()} vs TRL {expected.tolist()} (max gap {gap:.3g})"


# ---------------------------------------------------------------------------------------------
# docs/porting.md, as code


def grpo_options(trl: dict) -> dict:
    """RLConfig options for TRL's GRPOConfig (as resolved by the trainer: `effective`)."""
    loss_type, sequence = trl["loss_type"], trl["importance_sampling_level"] == "sequence"
    aggregation = {"grpo": "seq_mean_token_mean", "bnpo": "token_mean", "dapo": "token_mean",
                   "cispo": "token_mean", "dr_grpo": "seq_mean_token_sum_norm"}[loss_type]
    options = {"aggregation": aggregation, "max_len_norm": trl["max_completion_length"],
               "clip_eps_low": trl["epsilon_low"], "clip_eps_high": trl["epsilon_high"]}
    if loss_type == "cispo":
        options.update(loss="cispo", ratio_cap=trl["epsilon_high"], ratio_level=trl["importance_sampling_level"])
    else:
        options["loss"] = "gspo" if sequence else "ppo_clip"
    if trl["delta"] is not None:
        options["dual_clip"] = trl["delta"]
    if trl["beta"]:
        options.update(beta=trl["beta"], kl_placement="loss",
                       kl_estimator="k3_ratio" if trl["use_bias_correction_kl"] else "k3")
    return options


def rloo_options(trl: dict) -> dict:
    options = {"advantage": "rloo"}
    if trl.get("beta"):
        options.update(beta=trl["beta"], kl_placement="reward")
    if trl.get("normalize_advantages"):
        options.update(whiten_advantages=True, whiten_over="sequences", whiten_std="sample", whiten_eps=1e-4)
    return options


def grpo_advantage_options(trl: dict, eps: float = 1e-4) -> dict:
    scale = trl.get("scale_rewards", "group")
    if scale == "none":
        return {"advantage": "dr_grpo"}
    return {"advantage": "grpo", "scale": scale, "std": "sample", "advantage_eps": eps}


DPO_NAMES = {"sigmoid": "dpo", "hinge": "hinge", "ipo": "ipo", "robust": "robust", "exo_pair": "exo_pair",
             "nca_pair": "nca_pair", "bco_pair": "bco_pair", "sppo_hard": "sppo_hard", "aot": "aot",
             "aot_unpaired": "aot_pair", "apo_zero": "apo_zero", "apo_down": "apo_down",
             "discopop": "discopop", "sft": "sft"}


def dpo_options(trl: dict) -> dict:
    """PreferenceConfig options for TRL's DPOConfig (TRL 1.16's sigmoid ignores label_smoothing)."""
    types = trl["loss_type"] if isinstance(trl["loss_type"], list) else [trl["loss_type"]]
    weights = trl.get("loss_weights") or [1.0] * len(types)
    loss = DPO_NAMES[types[0]] if len(types) == 1 else ",".join(
        f"{DPO_NAMES[name]}={w:g}" for name, w in zip(types, weights))
    return {"loss": loss, "beta": trl.get("beta", 0.1), "label_smoothing": trl.get("label_smoothing", 0.0),
            "discopop_tau": trl.get("discopop_tau", 0.05)}


# ---------------------------------------------------------------------------------------------
# lmpo, through its trainers' code


class FixedLogprobs(torch.nn.Module):
    """A 'policy' whose log-probs are parameters: row i of a batch is the row whose prompt token is i."""

    def __init__(self, **tables: torch.Tensor):
        super().__init__()
        for name, table in tables.items():
            self.register_parameter(name, torch.nn.Parameter(table.clone()))

    def outputs(self, name: str, prompt_ids: torch.Tensor) -> TokenOutputs:
        logps = getattr(self, name)[prompt_ids[:, 0]]
        return TokenOutputs(logps, entropy=torch.zeros_like(logps.detach()))

    def rows(self, first_tokens: torch.Tensor, prompt_ids: torch.Tensor) -> TokenOutputs:
        """Chosen (first completion token 1) and rejected (2) rows in whatever order the trainer
        batches them — one forward over both, or one each."""
        chosen, rejected = self.outputs("chosen", prompt_ids), self.outputs("rejected", prompt_ids)
        pick = (first_tokens == 1)[:, None]
        return TokenOutputs(torch.where(pick, chosen.logprobs, rejected.logprobs), entropy=chosen.entropy)


def recording_updater(policy: torch.nn.Module) -> Updater:
    """lmpo's Updater on an optimizer that does not move the weights: the gradient stays readable."""
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.0)
    return Updater(optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0), 0.0, 3, "golden")


def lmpo_rl_loss(options: dict, x: dict, monkeypatch) -> tuple[float, torch.Tensor]:
    """(loss, d loss / d logps) of one lmpo update step on the case's fixed batch."""
    cfg = RLConfig(**options)
    mask, logps = t(x["mask"]), t(x["logps"])
    rows, width = mask.shape
    policy = FixedLogprobs(logps=logps)
    monkeypatch.setattr(rl_update, "completion_outputs",
                        lambda model, prompt_ids, *args, **kwargs: model.outputs("logps", prompt_ids))
    batch = Batch(prompt_ids=torch.arange(rows)[:, None], prompt_mask=torch.ones(rows, 1, dtype=torch.long),
                  completion_ids=torch.zeros(rows, width, dtype=torch.long), loss_mask=mask,
                  old_logprobs=t(x["old_logps"]), ref_logprobs=t(x["ref_logps"]) if cfg.beta else None,
                  advantages=t(x["advantages"])[:, None].expand(rows, width).contiguous())
    figures = rl_update.update(policy, recording_updater(policy), batch, cfg, rl_update.LossParts.from_config(cfg),
                               cfg.beta)
    return figures["loss"], policy.logps.grad * mask


def lmpo_advantages(options: dict, case: dict) -> torch.Tensor:
    x = case["inputs"]
    cfg = RLConfig(**options)
    rewards = torch.tensor([float("nan") if r is None else r for r in x["rewards"]], dtype=torch.float32)
    size = len(rewards)
    mask = t(x["completion_mask"])
    batch = Batch(prompt_ids=torch.zeros(size, 1, dtype=torch.long), prompt_mask=torch.ones(size, 1),
                  completion_ids=torch.zeros_like(mask, dtype=torch.long), loss_mask=mask,
                  old_logprobs=t(x["old_logps"]) if "old_logps" in x else torch.zeros_like(mask),
                  ref_logprobs=t(x["ref_logps"]) if "ref_logps" in x else None)
    scored = Scored(rollout=None, problems=[], group_ids=torch.arange(size) // x["group_size"], rewards=rewards,
                    components={}, grades=[], groups_sampled=0, groups_without_signal=0, valid=~rewards.isnan())
    compute_advantages(batch, scored, cfg, cfg.beta)
    return batch.advantages[:, 0]


def lmpo_preference(options: dict, x: dict, monkeypatch, **loss_options) -> tuple[float, torch.Tensor, torch.Tensor]:
    """(loss, d/d chosen per-token logps, d/d rejected ones) of one lmpo preference step."""
    cfg = PreferenceConfig(**options)
    chosen_mask, rejected_mask = t(x["chosen_mask"]), t(x["rejected_mask"])
    pairs, width = chosen_mask.shape
    policy = FixedLogprobs(chosen=t(x["chosen_logps"]), rejected=t(x["rejected_logps"]))
    monkeypatch.setattr(pref, "completion_outputs", lambda model, prompt_ids, prompt_mask, completion_ids, *a, **k:
                        model.rows(completion_ids[:, 0], prompt_ids))
    enc = EncodedPairs(torch.arange(pairs)[:, None], torch.ones(pairs, 1), torch.ones(pairs, width, dtype=torch.long),
                       chosen_mask, torch.full((pairs, width), 2), rejected_mask)
    loss_fn = PREFERENCE_LOSSES.get(cfg.loss)
    run = SimpleNamespace(autocast=nullcontext, dist=Distributed())
    ref = (t(x["ref_chosen_logps"]), t(x["ref_rejected_logps"]))
    opts = {**options_for(loss_fn, preference_options(cfg)), **loss_options}
    figures = pref.preference_step(run, policy, recording_updater(policy), enc, ref, loss_fn, cfg, opts)
    return figures["loss"], grad_of(policy.chosen) * chosen_mask, grad_of(policy.rejected) * rejected_mask


def grad_of(param: torch.Tensor) -> torch.Tensor:
    """The gradient, zeros where the loss does not read the parameter (sft and the rejected answers)."""
    return torch.zeros_like(param) if param.grad is None else param.grad


# ---------------------------------------------------------------------------------------------
# the cases


def test_golden_file_is_complete():
    data = golden()
    assert data["trl_version"] == "1.16.0", "the mapping below was read for TRL 1.16; regenerate and re-read"
    names = set(data["cases"])
    assert names, "no cases"
    handled = {n for n in names if data["cases"][n]["kind"] in KINDS}
    assert handled == names, f"cases of unknown kind: {sorted(names - handled)}"
    for name in EXPECTED_DIFFERENCES:
        assert "expected_difference" in data["cases"][name], f"{name} should be marked expected_difference"
    marked = {n for n, c in data["cases"].items() if "expected_difference" in c}
    unhandled = sorted(marked ^ set(EXPECTED_DIFFERENCES))
    assert not unhandled, f"expected differences marked in one place only: {unhandled}"


@pytest.mark.parametrize("name", case_names())
def test_case(name, monkeypatch):
    case = golden()["cases"][name]
    if name in EXPECTED_DIFFERENCES:
        EXPECTED_DIFFERENCES[name](case, monkeypatch)
    else:
        KINDS[case["kind"]](case, monkeypatch)


def check_grpo_loss(case, monkeypatch):
    for micro_batch_size in (0, 2):  # the whole minibatch at once, and two micro-batches accumulated
        options = {**grpo_options(case["effective"]), "micro_batch_size": micro_batch_size}
        loss, grad = lmpo_rl_loss(options, case["inputs"], monkeypatch)
        close(loss, case["outputs"]["loss"], f"loss (micro_batch_size={micro_batch_size})")
        close(grad, case["outputs"]["grad_logps"], f"gradient (micro_batch_size={micro_batch_size})")


def check_advantages(case, monkeypatch):
    kind, trl = case["kind"], case["config"]
    options = grpo_advantage_options(trl) if kind == "grpo_advantages" else rloo_options(trl)
    close(lmpo_advantages(options, case), case["outputs"]["advantages"], "advantages")
    if kind == "grpo_advantages" and trl.get("scale_rewards") == "none":  # the table's alternative
        scale_none = lmpo_advantages({"advantage": "grpo", "scale": "none"}, case)
        close(scale_none, case["outputs"]["advantages"], "grpo scale=none")
    if kind == "grpo_advantages" and trl.get("scale_rewards") == "group":
        # lmpo's default eps (verl's 1e-6) is not TRL's 1e-4: the table says ~3e-4 apart
        gap = (lmpo_advantages(grpo_advantage_options(trl, eps=1e-6), case) - t(case["outputs"]["advantages"]))
        assert 1e-5 < gap.abs().max().item() < 1e-3


def check_dpo(case, monkeypatch):
    loss, grad_chosen, grad_rejected = lmpo_preference(dpo_options(case["config"]), case["inputs"], monkeypatch)
    close(loss, case["outputs"]["loss"], "loss")
    close(grad_chosen, case["outputs"]["grad_chosen_logps"], "chosen gradient")
    close(grad_rejected, case["outputs"]["grad_rejected_logps"], "rejected gradient")


def unmapped(case, monkeypatch):
    pytest.fail("TRL's RLOO loss has no lmpo equivalent: only its documented differences are tested")


KINDS = {"grpo_loss": check_grpo_loss, "grpo_advantages": check_advantages, "rloo_advantages": check_advantages,
         "dpo_loss": check_dpo, "rloo_loss": unmapped}


def golden_case(name: str) -> dict:
    return golden()["cases"][name]


def differs_only_by_sequence_ratio_kl(case, monkeypatch):
    """GSPO + use_bias_correction_kl: the policy part agrees; TRL's KL part is k3 times the sequence ratio."""
    plain = golden_case("grpo_loss_gspo_beta")
    assert plain["inputs"] == case["inputs"] and plain["effective"]["beta"] == case["effective"]["beta"]
    options = grpo_options(case["effective"])
    lmpo_loss, _ = lmpo_rl_loss(options, case["inputs"], monkeypatch)
    assert abs(lmpo_loss - case["outputs"]["loss"]) > 1e-4, "the documented difference vanished"
    # TRL's extra term over plain k3 is beta * mean_i mean_t k3 * (s_i - 1), s_i = exp(mean_t rho)
    x = case["inputs"]
    mask = t(x["mask"])
    rho = (t(x["logps"]) - t(x["old_logps"])) * mask
    seq_ratio = (rho.sum(1) / mask.sum(1)).exp()[:, None].expand_as(mask)
    kl = k3(t(x["logps"]), t(x["ref_logps"]))
    extra = case["effective"]["beta"] * seq_mean_token_mean(kl * (seq_ratio - 1), mask)
    close(case["outputs"]["loss"] - plain["outputs"]["loss"], extra, "TRL's sequence-ratio KL term")


def differs_by_masked_rows(case, monkeypatch):
    """A fully masked row: TRL divides by all rows, lmpo by rows with a loss token."""
    mask = t(case["inputs"]["mask"])
    kept, rows = (mask.sum(1) > 0).sum().item(), mask.size(0)
    assert kept < rows
    loss, grad = lmpo_rl_loss(grpo_options(case["effective"]), case["inputs"], monkeypatch)
    close(loss * kept / rows, case["outputs"]["loss"], "loss x kept/all")
    close(grad * kept / rows, case["outputs"]["grad_logps"], "gradient x kept/all")


def rloo_sequence_ratio(case, monkeypatch):
    """TRL's RLOO loss: on-policy the gradient is lmpo's with token sums per sequence; the values differ."""
    options = {"loss": "ppo_clip", "aggregation": "seq_mean_token_sum_norm", "max_len_norm": 1}
    loss, grad = lmpo_rl_loss(options, case["inputs"], monkeypatch)
    x = case["inputs"]
    if x["old_logps"] == x["logps"]:
        close(grad, case["outputs"]["grad_logps"], "on-policy gradient")
    else:
        assert (grad - t(case["outputs"]["grad_logps"])).abs().max() > 1e-3
    assert abs(loss - case["outputs"]["loss"]) > 1e-3


def not_expressible(case, monkeypatch):
    assert case["config"]["loss_type"] not in POLICY_LOSSES, "lmpo now has this loss: map it and test it"


def bco_without_shift(case, monkeypatch):
    """TRL 1.16's bco_pair is lmpo's with delta=0; lmpo's trainer uses the batch mean instead."""
    options = dpo_options(case["config"])
    loss, grad_chosen, grad_rejected = lmpo_preference(options, case["inputs"], monkeypatch, delta=0.0)
    close(loss, case["outputs"]["loss"], "bco_pair(delta=0)")
    close(grad_chosen, case["outputs"]["grad_chosen_logps"], "chosen gradient")
    close(grad_rejected, case["outputs"]["grad_rejected_logps"], "rejected gradient")
    trained, _, _ = lmpo_preference(options, case["inputs"], monkeypatch)
    assert abs(trained - case["outputs"]["loss"]) > 1e-4


def sft_token_mean(case, monkeypatch):
    """TRL averages all chosen tokens of the batch: lmpo's per-answer means weighted by length."""
    x = case["inputs"]
    lengths = t(x["chosen_mask"]).sum(1)
    per_answer = -t(x["chosen_logps"]).sum(1) / lengths
    lmpo_loss, _, _ = lmpo_preference(dpo_options(case["config"]), x, monkeypatch)
    close(lmpo_loss, per_answer.mean(), "lmpo: mean of per-answer means")
    close((per_answer * lengths).sum() / lengths.sum(), case["outputs"]["loss"], "TRL: token mean")
    assert abs(lmpo_loss - case["outputs"]["loss"]) > 1e-4


def mpo_parts(case, monkeypatch):
    """MPO = 0.8 sigmoid + 0.2 bco_pair + 1.0 sft: lmpo's sum differs from TRL's by its two parts' differences."""
    weights = dict(zip(case["config"]["loss_type"], case["config"]["loss_weights"]))
    parts = {name: golden_case(f"dpo_{name}") for name in ("sigmoid_beta", "bco_pair", "sft")}
    assert all(p["inputs"] == case["inputs"] and p["config"]["beta"] == case["config"]["beta"] for p in parts.values())
    trl_sum = sum(weights[n] * parts[k]["outputs"]["loss"] for n, k in
                  (("sigmoid", "sigmoid_beta"), ("bco_pair", "bco_pair"), ("sft", "sft")))
    close(trl_sum, case["outputs"]["loss"], "TRL's weighted sum of its parts")
    lmpo_loss, _, _ = lmpo_preference(dpo_options(case["config"]), case["inputs"], monkeypatch)
    lmpo_parts = {n: lmpo_preference(dpo_options({**case["config"], "loss_type": n, "loss_weights": None}),
                                     case["inputs"], monkeypatch)[0] for n in ("sigmoid", "bco_pair", "sft")}
    close(lmpo_loss, sum(weights[n] * v for n, v in lmpo_parts.items()), "lmpo's weighted sum of its parts")


EXPECTED_DIFFERENCES = {
    "grpo_loss_gspo_bias_correction_kl": differs_only_by_sequence_ratio_kl,
    "grpo_loss_masked_row_grpo": differs_by_masked_rows,
    "grpo_loss_masked_row_dr_grpo": differs_by_masked_rows,
    "grpo_loss_sapo": not_expressible,
    "rloo_loss_on_policy": rloo_sequence_ratio,
    "rloo_loss_off_policy": rloo_sequence_ratio,
    "dpo_bco_pair": bco_without_shift,
    "dpo_sft": sft_token_mean,
    "dpo_mpo": mpo_parts,
}
