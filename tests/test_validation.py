"""Config values that cannot work fail at start-up, before any model loads, naming the
values that conflict."""

from __future__ import annotations

import re

import pytest

from lmpo.cli.main import main
from lmpo.trainers.online_dpo import OnlineDPOConfig, train_online_dpo
from lmpo.trainers.pipeline import PipelineConfig, run_pipeline
from lmpo.trainers.preference import PreferenceConfig, train_preference
from lmpo.trainers.reward_model import RewardModelConfig, train_reward_model
from lmpo.trainers.rl import train_rl
from lmpo.trainers.rl_config import RLConfig
from lmpo.trainers.supervised import CPTConfig, SFTConfig, train_cpt, train_sft
from lmpo.trainers.validation import ConfigError

NO_MODEL = "/nonexistent/model"  # loading it would fail differently: the check must come first

CASES = [
    (train_rl, RLConfig(model=NO_MODEL, prompts_per_step=3, group_size=5, num_minibatches=2),
     r"num_minibatches=2 must divide prompts_per_step x group_size = 15"),
    (train_rl, RLConfig(model=NO_MODEL, num_minibatches=2, micro_batch_size=5),
     r"micro_batch_size=5 must divide the minibatch size 32"),
    (train_rl, RLConfig(model=NO_MODEL, group_size=1), r"group_size=1: group-relative advantages need at least 2"),
    (train_rl, RLConfig(model=NO_MODEL, lr=0, save_every=10, keep_checkpoints=0, reward_timeout=-1),
     r"reward_timeout=-1 must be >= 0.*lr=0 must be > 0.*keep_checkpoints=0 must be >= 1"),
    (train_rl, RLConfig(model=NO_MODEL, rewards="rm=1.0"), r"reward 'rm' needs reward_model"),
    (train_sft, SFTConfig(model=NO_MODEL, batch_size=0, epochs=0), r"invalid SFT config: batch_size=0 must be >= 1.*epochs=0"),
    (train_cpt, CPTConfig(model=NO_MODEL, seq_len=1, min_lr_ratio=2), r"min_lr_ratio=2 must be in \[0, 1\].*seq_len=1"),
    (train_preference, PreferenceConfig(model=NO_MODEL, loss="kto", label_smoothing=0.5),
     r"loss='kto' is not one of.*label_smoothing=0.5"),
    (train_online_dpo, OnlineDPOConfig(model=NO_MODEL, samples_per_prompt=1), r"samples_per_prompt=1: a pair is the best"),
    (train_reward_model, RewardModelConfig(model=NO_MODEL, heldout_pairs=0, batch_size=0),
     r"heldout_pairs=0 must be >= 1.*batch_size=0"),
    # ignored in silence before: the adapter they shape is never made without lora_r
    (train_sft, SFTConfig(model=NO_MODEL, lora_alpha=32, lora_target_modules="q_proj"),
     r"lora_alpha=32 shapes a LoRA adapter, and there is none: set lora_r > 0, or leave lora_alpha out; "
     r"lora_target_modules='q_proj' shapes"),
    (train_rl, RLConfig(model=NO_MODEL, lora_dropout=0.1), r"lora_dropout=0.1 shapes a LoRA adapter"),
    (train_rl, RLConfig(model=NO_MODEL, reward_model="rm_dir"),
     r"reward_model='rm_dir' is read only by the reward 'rm', which rewards='correct=1.0' does not name"),
    (train_sft, SFTConfig(model=NO_MODEL, eval_prompts="held.jsonl", eval_problems=0),
     r"eval_prompts='held.jsonl' is not read with eval_problems=0"),
]


@pytest.mark.parametrize("train, cfg, message", CASES, ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(CASES)])
def test_impossible_values_fail_before_the_model_loads(train, cfg, message):
    with pytest.raises(ConfigError, match=message):
        train(cfg)


def test_pipeline_checks_every_stage_before_the_first(tmp_path):
    cfg = PipelineConfig(out=str(tmp_path / "p"), rl="dpo")
    cfg.dpo.batch_size = 0
    with pytest.raises(ConfigError, match="invalid preference config: batch_size=0"):
        run_pipeline(cfg)
    assert not (tmp_path / "p" / "cpt").exists()  # CPT never started


def test_the_cli_prints_the_conflict_and_exits_2(capsys):
    assert main(["train", "grpo", "--model", NO_MODEL, "--prompts_per_step", "3", "--group_size", "5",
                 "--num_minibatches", "2"]) == 2
    assert "num_minibatches=2 must divide prompts_per_step x group_size = 15" in capsys.readouterr().err


@pytest.mark.parametrize("settings,said", [
    ({"guard_kl_max": 2.0}, "guard_kl_max=2.0 tunes the collapse guard, which is off"),
    ({"stop_min_delta": 0.1}, "stop_min_delta=0.1 is the improvement stop_patience waits for"),
    ({"keep_checkpoints": 3, "save_every": 0}, "keep_checkpoints=3 counts checkpoints, and save_every=0 writes none"),
    ({"termination_penalty": 5.0}, "termination_penalty=5.0 is what a 'penalise' ending costs"),
])
def test_options_that_would_be_ignored_are_refused(settings, said):
    """Each was accepted, and the run's metrics were those of a run without it."""
    from lmpo.trainers.rl_config import RLConfig

    with pytest.raises(ValueError, match=re.escape(said)):
        RLConfig(**settings).validate()
    RLConfig(termination_penalty=5.0, termination_policy="max_turns=penalise").validate()
    RLConfig(collapse_guard=True, guard_kl_max=2.0, save_every=5).validate()
    RLConfig(stop_patience=2, stop_min_delta=0.1, eval_problems=8).validate()


@pytest.mark.parametrize("config", [SFTConfig, CPTConfig])
def test_eval_options_with_data_and_no_eval_prompts_are_refused(config):
    """With --data the task's held-out set is not evaluated: --eval_problems 10 was accepted, and
    the run reported accuracy n/a."""
    with pytest.raises(ValueError, match="eval_problems=10 shapes the held-out evaluation, and with --data there is none"):
        config(data="train.jsonl", eval_problems=10).validate()
    config(data="train.jsonl", eval_problems=10, eval_prompts="heldout.jsonl").validate()
    config(eval_problems=10).validate()


@pytest.mark.parametrize("trainer", ["dpo", "orpo", "kto"])
def test_offline_eval_options_with_data_are_refused(trainer, tmp_path, capsys):
    """DPO, ORPO and KTO have no held-out evaluation with --data (nor an --eval_prompts to give one):
    --eval_problems 40 --eval_max_new_tokens 20 were accepted, the run said `held-out accuracy n/a`
    and config.json recorded eval_problems 40. Refused as SFT refuses them; defaults and 0 pass."""
    from lmpo.trainers.kto import KTOConfig
    from lmpo.trainers.orpo import ORPOConfig

    config = {"dpo": PreferenceConfig, "orpo": ORPOConfig, "kto": KTOConfig}[trainer]
    with pytest.raises(ValueError, match="eval_problems=40 shapes the held-out evaluation, and with --data there is "
                                         "none .*eval_max_new_tokens=20 shapes"):
        config(data="pairs.jsonl", eval_problems=40, eval_max_new_tokens=20).validate()
    config(data="pairs.jsonl").validate()
    config(data="pairs.jsonl", eval_problems=0).validate()
    config(eval_problems=40, eval_max_new_tokens=20).validate()
    out = tmp_path / "run"
    assert main(["train", trainer, "--data", "pairs.jsonl", "--eval_problems", "40", "--out", str(out)]) == 2
    assert "eval_problems=40 shapes the held-out evaluation" in capsys.readouterr().err and not out.exists()


def test_a_negative_thread_count_is_refused(capsys):
    """`--threads -1` ran with one thread per core, as 0 does, though the help gives 0 for that."""
    assert main(["train", "sft", "--threads", "-1", "--out", "unused"]) == 2
    assert "threads=-1 must be >= 0" in capsys.readouterr().err
    assert main(["eval", "--model", "tiny", "--threads", "-1"]) == 2
    assert "threads=-1 must be >= 0" in capsys.readouterr().err


def test_multi_turn_options_on_a_single_turn_task_are_refused(capsys):
    """`--max_turns 3` and `--max_parse_errors 1` were accepted on sort_digits and changed nothing."""
    for command in (["train", "grpo", "--out", "unused"], ["eval"]):
        assert main([*command, "--model", "tiny", "--task", "sort_digits", "--max_turns", "3", "--threads", "1"]) == 2
        assert "max_turns=3 shapes multi-turn episodes, and task 'sort_digits(length=5)' is single-turn" in \
            capsys.readouterr().err
    from lmpo.envs import make_task
    from lmpo.trainers.rl_config import RLConfig
    from lmpo.trainers.validation import single_turn_problems

    assert single_turn_problems(RLConfig(max_turns=1), make_task("sort_digits")) == []
    assert single_turn_problems(RLConfig(max_turns=3, max_parse_errors=1), make_task("calculator")) == []
    assert single_turn_problems(RLConfig(max_parse_errors=1), make_task("sort_digits"))


@pytest.mark.parametrize("stage", ["sft", "grpo", "dpo", "rm", "rft", "online_dpo"])
def test_min_lr_ratio_with_a_constant_schedule_is_refused(stage, capsys):
    """`--lr_schedule constant --min_lr_ratio 0.5` was accepted and the ratio never read."""
    assert main(["train", stage, "--lr_schedule", "constant", "--min_lr_ratio", "0.5", "--out", "unused"]) == 2
    assert "min_lr_ratio=0.5 is where a cosine or linear decay ends, and lr_schedule=constant does not decay" in \
        capsys.readouterr().err


@pytest.mark.parametrize("samples,horizon,smallest", [((4, 2), 1, 2), ((5, 2), 2, 3), ((4, 4), 3, 4)])
def test_a_kl_horizon_that_can_make_beta_negative_is_refused(samples, horizon, smallest, capsys):
    """The adaptive KL controller multiplies beta by 1 + clip(KL / target - 1, ±0.2) x samples / horizon:
    `--target_kl 5 --kl_horizon 1` with 4x2 samples per step ran with beta 0.05 -> -0.03 -> 0.018."""
    prompts, group = samples
    argv = ["train", "ppo", "--model", NO_MODEL, "--out", "unused", "--prompts_per_step", str(prompts), "--group_size",
            str(group), "--eval_problems", "0", "--threads", "1", "--target_kl", "5", "--kl_horizon", str(horizon)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"kl_horizon={horizon} is too short for {prompts * group} samples per step (prompts_per_step x " \
           f"group_size)" in err and f"--kl_horizon must be >= {smallest}" in err
    options = dict(prompts_per_step=prompts, group_size=group, beta=0.05, target_kl=5.0)
    RLConfig(**options, kl_horizon=smallest).validate()
    RLConfig(prompts_per_step=prompts, group_size=group, beta=0.05, kl_horizon=10_000).validate()  # no controller


def test_the_kl_controller_refuses_a_horizon_that_zeroes_beta():
    from lmpo.algos import adaptive_kl_coef

    with pytest.raises(ValueError, match=r"n_steps / horizon must be < 5 .*n_steps=10, horizon=2"):
        adaptive_kl_coef(0.05, 0.0, 5.0, 2, 10)
    assert adaptive_kl_coef(0.05, 0.0, 5.0, 3, 10) == pytest.approx(0.05 * (1 - 0.2 * 10 / 3))


@pytest.mark.parametrize("preset,option", [("ppo", "gae_lambda"), ("reinforce_pp", "gamma"), ("ppo", "gamma")])
@pytest.mark.parametrize("value", ["1.5", "-0.1", "nan"])
def test_a_discount_outside_0_1_is_refused_before_the_model_loads(preset, option, value, capsys):
    """`--gae_lambda 1.5` failed only after the models loaded and a rollout ran, as
    "gamma and lam must be in [0, 1], got gamma=1.0, lam=1.5"."""
    assert main(["train", preset, "--model", NO_MODEL, "--out", "unused", "--eval_problems", "0", "--threads", "1",
                 f"--{option}", value]) == 2
    assert f"{option}={float(value)} must be in [0, 1]" in capsys.readouterr().err
    RLConfig(advantage="gae", critic="head", gamma=0.0, gae_lambda=1.0).validate()  # the ends are allowed


def test_a_conflict_the_preset_made_says_so_and_how_to_undo_it(capsys, tmp_path):
    """`lmpo train ppo --advantage grpo` said "critic=separate is only used by advantage=gae", as if
    the user had asked for the critic: the ppo preset sets it."""
    base = ["--model", NO_MODEL, "--out", "unused", "--eval_problems", "0", "--threads", "1"]
    assert main(["train", "ppo", *base, "--advantage", "grpo"]) == 2
    assert "invalid RL config: critic=separate is only used by advantage=gae (the ppo preset sets " \
           "critic=separate; pass --critic none)" in capsys.readouterr().err
    assert main(["train", "rl", "--preset", "ppo", *base, "--advantage", "rloo", "--gamma", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "(the ppo preset sets critic=separate; pass --critic none); gamma=0.5 is not used by advantage=rloo " \
           "(rloo takes: none of these options)" in err and "preset sets gamma" not in err
    for given in (["--critic", "head"], ["--config", str(tmp_path / "c.yaml")]):  # the user's own: no hint
        (tmp_path / "c.yaml").write_text("critic: head\n")
        assert main(["train", "ppo", *base, "--advantage", "grpo", *given]) == 2
        err = capsys.readouterr().err
        assert "critic=head is only used by advantage=gae" in err and "preset" not in err


def test_a_conflict_the_pipelines_preset_made_names_the_stage_flag(capsys, tmp_path):
    """`lmpo pipeline --rl ppo --rl_stage.advantage grpo` gave the bare conflict, as `lmpo train`
    did before: the ppo preset sets the critic, and the flag that undoes it is the stage's."""
    out = tmp_path / "pl"
    assert main(["pipeline", "--rl", "ppo", "--rl_stage.advantage", "grpo", "--out", str(out)]) == 2
    assert "invalid RL config: critic=separate is only used by advantage=gae (the ppo preset sets critic=separate; " \
           "pass --rl_stage.critic none)" in capsys.readouterr().err
    assert main(["pipeline", "--rl", "ppo", "--rl_stage.advantage", "grpo", "--rl_stage.critic", "head",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "critic=head is only used by advantage=gae" in err and "preset" not in err
    assert not out.exists()
