import pytest

from lmpo.envs import SortDigits, make_task, parse_reward_weights
from lmpo.envs.rewards import correct_reward, format_reward


@pytest.fixture(scope="module")
def task():
    return SortDigits()


def test_training_data_never_contains_a_heldout_problem(task):
    heldout = {p.prompt for p in task.heldout_problems(2000)}
    assert len(heldout) == 2000 and all(task.is_heldout(p) for p in task.heldout_problems(2000))
    train = {p.prompt for p in task.train_problems(20_000, seed=0)}
    demos = {p.prompt for p in task.sft_demonstrations(2000, seed=0)}
    corpus = {line.split("=")[0] + "=" for line in task.cpt_corpus(20_000, seed=0)}
    assert not heldout & train and not heldout & demos and not heldout & corpus


def test_heldout_set_is_fixed_and_independent_of_run_seeds(task):
    assert task.heldout_problems(500) == SortDigits().heldout_problems(500)
    assert task.train_problems(50, seed=1) != task.train_problems(50, seed=2)


def test_grader_is_strict_and_never_raises(task):
    p = task.make("31415")
    assert p.prompt == "31415=" and p.answer == "11345"
    assert task.grade(p, "11345", True).correct
    for text, terminated in [("11345", False), ("1345", True), (" 11345", True), ("11345 ", True),
                             ("11345<eos>", True), ("", True), ("١١٣٤٥", True), ("1134５", True)]:
        g = task.grade(p, text, terminated)
        assert not g.correct, (text, terminated)
    assert task.grade(p, "1345", True).well_formed  # wrong but well-formed
    assert not task.grade(p, "11345", False).well_formed  # not terminated
    assert not task.grade(p, "11 345", True).well_formed


def test_cpt_corpus_carries_the_flaw_at_the_configured_rate():
    task = SortDigits(flaw_rate=0.6)
    lines = task.cpt_corpus(20_000, seed=0)
    with_repeats = [line for line in lines if len(set(line.split("=")[0])) < 5]
    flawed = sum(line.split("=")[1] != "".join(sorted(line.split("=")[0])) for line in with_repeats)
    assert 0.57 < flawed / len(with_repeats) < 0.63
    clean = SortDigits(flaw_rate=0.0).cpt_corpus(2000, seed=0)
    assert all(line.split("=")[1] == "".join(sorted(line.split("=")[0])) for line in clean)


def test_sft_demonstrations_have_no_repeated_digits(task):
    for p in task.sft_demonstrations(500, seed=0):
        digits = p.prompt[:-1]
        assert len(set(digits)) == len(digits) and p.answer == "".join(sorted(digits))


def test_rewards_use_the_grader(task):
    probs = [task.make("31415"), task.make("90210")]
    texts, terminated = ["11345", "0129"], [True, True]
    assert correct_reward(task, probs, texts, terminated) == [1.0, 0.0]
    assert format_reward(task, probs, texts, terminated) == [1.0, 1.0]


def test_task_and_reward_specs_give_clear_errors():
    assert make_task("sort_digits:length=6").length == 6
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        make_task("nope")
    with pytest.raises(ValueError, match="key=value"):
        make_task("sort_digits:length")
    with pytest.raises(ValueError, match="has no option 'colour'; its options: length, flaw_rate, heldout_share"):
        make_task("sort_digits:colour=3")
    assert parse_reward_weights("correct=1.0, format=0.1") == {"correct": 1.0, "format": 0.1}
    with pytest.raises(ValueError, match="unknown reward function 'speed'"):
        parse_reward_weights("speed=1")
    with pytest.raises(ValueError, match="must be a number"):
        parse_reward_weights("correct=high")


def test_evaluate_scores_greedy_outputs(tiny_llama, char_tokenizer, task):
    from lmpo.rollout.evaluation import evaluate

    result = evaluate(tiny_llama, char_tokenizer, task, task.heldout_problems(20), max_new_tokens=6)
    assert result.n == 20 and 0 <= result.accuracy <= result.format_accuracy <= 1
