import json
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lmpo.cli.main import main


@pytest.mark.parametrize("rl", ["grpo", "ppo", "dpo", "online_dpo", "ppo_rm"])
def test_small_pipeline_end_to_end_through_the_cli(rl, tmp_path, capsys):
    out = tmp_path / "pipe"
    config = tmp_path / "small.yaml"
    config.write_text(
        "cpt:\n  steps: 20\n  corpus_documents: 3000\n  eval_problems: 50\n"
        "sft:\n  epochs: 1\n  demonstrations: 64\n  eval_problems: 50\n"
        "rl_stage:\n  steps: 3\n  prompts_per_step: 2\n  group_size: 4\n  eval_problems: 50\n  prompt_pool: 100\n"
        "dpo:\n  pairs: 32\n  eval_problems: 50\n"
        "online_dpo:\n  rounds: 2\n  prompts_per_round: 8\n  eval_problems: 50\n  rewards: correct=1.0,format=0.5\n"
        "rm:\n  pairs: 32\n  heldout_pairs: 16\n")
    assert main(["pipeline", "--config", str(config), "--out", str(out), "--threads", "1", "--rl", rl]) == 0
    printed = capsys.readouterr().out
    assert "held-out accuracy" in printed and "summary.json" in printed
    summary = json.loads((out / "summary.json").read_text())
    # the last stage is named after the preset; ppo_rm's reward model is a stage before it
    assert [s["name"] for s in summary["stages"]] == ["cpt", "sft", *(["rm"] if rl == "ppo_rm" else []), rl]
    for stage in summary["stages"]:
        if stage["kind"] == "reward_model":
            assert 0 <= stage["pairwise_accuracy"] <= 1 and stage["seconds"] > 0
            continue
        assert 0 <= stage["accuracy"] <= 1 and stage["seconds"] > 0
        model_dir = out / stage["run_dir"] / "model"
        model = AutoModelForCausalLM.from_pretrained(model_dir)  # plain transformers, no lmpo code
        tok = AutoTokenizer.from_pretrained(model_dir)
        assert model(torch.tensor([tok("12=").input_ids])).logits.shape[-1] == len(tok)
    assert (out / "report" / "report.html").exists()
    assert (out / rl / "report" / "report.html").exists()
    if rl in ("grpo", "ppo", "ppo_rm"):
        assert (out / rl / "report" / "reward.png").exists()


def test_the_pipeline_stops_stages_by_their_held_out_scores_by_default():
    from lmpo.trainers.pipeline import ADAPTIVE_BUDGETS, PipelineConfig, flat_options, resolve_pipeline
    from lmpo.trainers.supervised import CPTConfig

    adaptive = flat_options(resolve_pipeline(PipelineConfig()))
    assert {k: adaptive[k] for k in ADAPTIVE_BUDGETS} == ADAPTIVE_BUDGETS
    fixed = flat_options(resolve_pipeline(PipelineConfig(adaptive=False)))
    assert fixed["cpt.stop_patience"] == fixed["rl_stage.stop_patience"] == 0 and fixed["cpt.max_minutes"] == 0
    assert {k: v for k, v in adaptive.items() if k not in ADAPTIVE_BUDGETS and k != "adaptive"} == \
        {k: v for k, v in fixed.items() if k not in ADAPTIVE_BUDGETS and k != "adaptive"}  # only the rules differ
    increment = resolve_pipeline(PipelineConfig(task="increment")).rl_stage
    assert (increment.stop_patience, increment.eval_every, increment.steps) == (4, 100, 1000)  # the task's own rule
    own = resolve_pipeline(PipelineConfig(rl_stage=replace(PipelineConfig().rl_stage, stop_patience=7)))
    assert own.rl_stage.stop_patience == 7
    on_data = resolve_pipeline(PipelineConfig(cpt=CPTConfig(data="corpus.jsonl")))
    assert on_data.cpt.stop_patience == 0 and on_data.rl_stage.stop_patience == 3  # no task corpus to hold out
    on_data.cpt.validate()


@pytest.mark.slow
def test_default_pipeline_learns_within_budget(tmp_path):
    """The acceptance check: GRPO gains >= 20 points over SFT, with format already high after
    SFT. (Its wall time is reported in summary.json, not asserted.)"""
    out = tmp_path / "pipe"
    assert main(["pipeline", "--out", str(out)]) == 0
    stages = {s["name"]: s for s in json.loads((out / "summary.json").read_text())["stages"]}
    assert stages["sft"]["format_accuracy"] >= 0.9
    assert stages["grpo"]["accuracy"] - stages["sft"]["accuracy"] >= 0.20


@pytest.mark.slow
@pytest.mark.parametrize("task", ["vault", "calculator"])
def test_agentic_pipeline_learns_within_budget(task, tmp_path):
    """The agents acceptance check: on each embedded agentic task GRPO gains >= 20 points of
    held-out success over SFT, every held-out episode calls the tool, and tool output stays out
    of the loss (the RL rows log the share of observation tokens)."""
    out = tmp_path / task
    assert main(["pipeline", "--task", task, "--out", str(out)]) == 0
    stages = {s["name"]: s for s in json.loads((out / "summary.json").read_text())["stages"]}
    assert stages["grpo"]["accuracy"] - stages["sft"]["accuracy"] >= 0.20
    assert stages["sft"]["tool_call_rate"] == stages["grpo"]["tool_call_rate"] == 1.0
    rows = [json.loads(line) for line in (out / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert all(0 < r["obs_token_frac"] < 1 for r in rows if "reward_mean" in r)


@pytest.mark.slow
def test_aftersales_pipeline_learns_within_budget(tmp_path):
    """The after-sales acceptance check: held-out success after GRPO is >= 15 points above SFT,
    guardrail blocks per held-out episode fall, and the source databases are never written."""
    from lmpo.envs import make_task
    from lmpo.envs.aftersales.db import file_checksum

    task = make_task("aftersales")
    sources = [task.database(), task.database(heldout=True)]
    before = [file_checksum(p) for p in sources]
    out = tmp_path / "aftersales"
    assert main(["pipeline", "--task", "aftersales", "--out", str(out), "--threads", "1"]) == 0
    stages = {s["name"]: s for s in json.loads((out / "summary.json").read_text())["stages"]}
    assert stages["grpo"]["accuracy"] - stages["sft"]["accuracy"] >= 0.15
    blocks = [stages[name]["breakdown"].get("guardrail_blocks_mean", 0.0) for name in ("sft", "grpo")]
    assert blocks[1] < blocks[0]
    assert len(stages["grpo"]["breakdown"]["by_kind"]) == 8
    assert [file_checksum(p) for p in sources] == before


def test_the_doctors_remedies_inside_the_pipeline_name_its_section_flags():
    """After the RL stage the pipeline printed remedies such as `--max_new_tokens`, a flag
    `lmpo pipeline` refuses; inside it the stage's options are `--rl_stage.max_new_tokens`."""
    from lmpo.trainers.pipeline import as_pipeline_flags

    said = "→ raise --max_new_tokens, or --rewards format=0.1; more --sft.epochs; --threads 1; --lr"
    assert as_pipeline_flags(said, "grpo") == ("→ raise --rl_stage.max_new_tokens, or --rl_stage.rewards format=0.1; "
                                               "more --sft.epochs; --threads 1; --rl_stage.lr")
    assert as_pipeline_flags("→ more --epochs", "sft") == "→ more --sft.epochs"
    assert as_pipeline_flags("→ lower --beta", "dpo") == "→ lower --dpo.beta"


def test_ppo_rms_reward_model_is_a_stage_of_the_summary_trained_or_kept(tmp_path, capsys):
    """QA: `--rl ppo_rm` said its reward model's accuracy in one line and left the stage out of
    summary.json (stages cpt, sft, ppo_rm; total_seconds without its time), the table and the
    report. Now it is the stage `rm`, kind reward_model, its held-out pairwise accuracy as
    `pairwise_accuracy` (not `accuracy`: answers it has none), and a resumed pipeline that kept
    it lists it all the same."""
    import re

    out = tmp_path / "pipe"
    assert main(["pipeline", "--out", str(out), "--rl", "ppo_rm", "--threads", "1", "--adaptive", "false",
                 "--cpt.steps", "4", "--cpt.corpus_documents", "600", "--cpt.eval_problems", "4",
                 "--sft.epochs", "1", "--sft.demonstrations", "16", "--sft.eval_problems", "4", "--rm.pairs", "48",
                 "--rm.heldout_pairs", "16", "--rm.epochs", "1", "--rl_stage.steps", "1",
                 "--rl_stage.prompts_per_step", "2", "--rl_stage.group_size", "2",
                 "--rl_stage.eval_problems", "4"]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert [s["name"] for s in summary["stages"]] == ["cpt", "sft", "rm", "ppo_rm"]
    rm = summary["stages"][2]
    assert (rm["kind"], rm["accuracy"], rm["run_dir"]) == ("reward_model", None, "rm")
    assert 0 <= rm["pairwise_accuracy"] <= 1 and rm["seconds"] > 0
    assert [s["kind"] for s in summary["stages"]] == ["policy", "policy", "reward_model", "policy"]
    assert summary["total_seconds"] == pytest.approx(sum(s["seconds"] for s in summary["stages"]), abs=0.05)
    pct = f"{100 * rm['pairwise_accuracy']:.1f}%"
    assert f"[pipeline] rm (reward model): held-out pairwise accuracy {pct}" in printed
    assert re.search(rf"rm \(reward model\) *│ *{re.escape(pct)} pairwise *│ *n/a", printed), printed
    html = (out / "report" / "report.html").read_text()
    assert f'<td>rm (reward model)</td><td class="num">{pct} pairwise</td>' in html
    (out / "summary.json").unlink()  # as if the pipeline had been stopped in its last stage
    (out / "ppo_rm" / "result.json").unlink()
    assert main(["pipeline", "--resume", str(out)]) == 0
    assert "[pipeline] rm: finished earlier with these options; kept" in capsys.readouterr().out
    again = json.loads((out / "summary.json").read_text())
    assert [s["name"] for s in again["stages"]] == ["cpt", "sft", "rm", "ppo_rm"]
    assert again["stages"][2] == rm
