"""What the issue-14 tests share: small runs of each trainer and the one-line error they expect."""

RL_RUN = ["--steps", "2", "--prompts_per_step", "2", "--group_size", "2", "--max_new_tokens", "4",
          "--eval_problems", "0", "--save_every", "1", "--threads", "1", "--reward_timeout", "0"]
SFT_RUN = ["--demonstrations", "8", "--batch_size", "4", "--epochs", "1", "--save_every", "1",
           "--eval_problems", "0", "--threads", "1"]


def error_line(capsys) -> str:
    """The last line on stderr, which must be lmpo's one-line error."""
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("lmpo: error: "), err
    return err[-1]
