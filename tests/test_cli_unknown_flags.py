"""An unknown flag or config key is reported by the command it was given to, with lmpo's name
for an option TRL spells differently, or the nearest flag. Before, `lmpo train grpo --stepz 3`
printed the top-level usage (`usage: lmpo [-h] COMMAND ...`) and no hint."""

import pytest

from lmpo.cli.main import main


def _error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


def test_an_unknown_flag_is_reported_by_its_command_with_a_hint(capsys):
    err = _error(capsys, ["train", "grpo", "--num_generations", "4", "--learning_rate=1e-6", "--stepz", "3"])
    assert "usage: lmpo train grpo" in err
    assert err.strip().endswith(
        "lmpo train grpo: error: unrecognized arguments: --num_generations 4 --learning_rate=1e-6 --stepz 3 "
        "(--num_generations: lmpo calls it --group_size; --learning_rate: lmpo calls it --lr; "
        "--stepz: did you mean --steps?; docs/porting.md maps TRL's and verl's options to lmpo's)")
    err = _error(capsys, ["pipeline", "--rl_stage.bta", "0.1"])
    assert err.strip().endswith("(--rl_stage.bta: did you mean --rl_stage.beta?)")
    err = _error(capsys, ["eval", "--model", "m", "stray"])
    assert err.strip().endswith("lmpo eval: error: unrecognized arguments: stray")
    # no hint for a name unlike any flag; a TRL name whose lmpo option this command lacks gets none
    assert _error(capsys, ["train", "dpo", "--max_steps", "3"]).strip().endswith("unrecognized arguments: --max_steps 3")


def test_a_config_key_gets_the_same_hint(capsys, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("rl_stage:\n  learning_rate: 0.1\n  bta: 0.2\n")
    assert main(["pipeline", "--config", str(config)]) == 2
    assert "line 2: rl_stage.learning_rate: unknown option (lmpo calls it rl_stage.lr);" in capsys.readouterr().err
    config.write_text("stepz: 3\n")
    assert main(["train", "grpo", "--config", str(config)]) == 2
    assert "line 1: stepz: unknown option (did you mean steps?);" in capsys.readouterr().err


def test_a_flag_is_taken_only_whole_and_a_wrong_stage_section_is_hinted(capsys):
    """`--sft.epoch` passed for `--sft.epochs` (a YAML config refuses it); `--grpo.steps` (the stage
    is named after the preset) got 344 lines of usage and no hint."""
    err = _error(capsys, ["pipeline", "--sft.epoch", "1"])
    assert err.strip().endswith("unrecognized arguments: --sft.epoch 1 (--sft.epoch: did you mean --sft.epochs?)")
    err = _error(capsys, ["pipeline", "--grpo.steps", "2"])
    assert err.splitlines()[0] == "usage: lmpo pipeline [options]  (`lmpo pipeline --help` lists them)"
    assert "(--grpo.steps: did you mean --cpt.steps or --rl_stage.steps?)" in err and len(err.splitlines()) == 2


def test_options_of_a_pipeline_stage_that_does_not_run_are_refused(capsys):
    """`--dpo.beta 0.3` under `--rl grpo` (or `--rl_stage.*` under `--rl dpo`) was recorded and ignored."""
    assert main(["pipeline", "--dpo.beta", "0.3", "--rm.pairs", "50"]) == 2
    assert capsys.readouterr().err.strip() == ("lmpo: error: dpo.beta, rm.pairs: no dpo or rm stage runs with --rl "
                                               "grpo (its stages' options: --cpt.*, --sft.*, --rl_stage.*)")
    assert main(["pipeline", "--rl", "dpo", "--rl_stage.steps", "3"]) == 2
    assert "rl_stage.steps: no rl_stage stage runs with --rl dpo" in capsys.readouterr().err


def test_pipeline_help_offers_no_stage_option_it_refuses(capsys):
    """`--sft.out`, `--cpt.resume`, `--rl_stage.seed` were listed, then refused when given."""
    with pytest.raises(SystemExit):
        main(["pipeline", "--help"])
    text = capsys.readouterr().out
    assert "--sft.epochs" in text and "--out" in text
    assert not any(f"--{s}.{o} " in text for s in ("cpt", "sft", "rl_stage") for o in ("out", "model", "resume", "seed"))
    assert main(["pipeline", "--sft.out", "x"]) == 2
    assert "sft.out: the pipeline sets each stage's out" in capsys.readouterr().err


def test_online_dpo_help_lists_no_option_it_refuses(capsys):
    """`lmpo train online_dpo --help` listed --max_length and --overlong (a pair file's options),
    which online DPO, sampling its own pairs, always refuses. Hidden; still refused by name, with
    online DPO's reason (it said "only read with --data FILE", an option online DPO refuses too)."""
    from lmpo.cli.main import main

    with pytest.raises(SystemExit):
        main(["train", "online_dpo", "--help"])
    text = capsys.readouterr().out
    assert "--max_length" not in text and "--overlong" not in text and "--max_new_tokens" in text
    assert main(["train", "online_dpo", "--max_length", "5", "--out", "unused"]) == 2
    assert "max_length=5 is not read by online DPO" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # nor does the pipeline's online DPO stage
        main(["pipeline", "--help"])
    text = capsys.readouterr().out
    assert not any(f"--online_dpo.{o} " in text for o in ("max_length", "overlong", "data", "pairs", "log_every"))
    assert "--online_dpo.rounds " in text and "--dpo.max_length " in text
