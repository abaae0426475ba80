"""The after-sales rewards cannot be gamed: a refund is paid once, the process reward pays the
steps of the reference resolution once each, a reply states its facts as whole words and
contradicts none of them, every write (a hand-off too) needs its evidence, bad model input is
refused rather than crashing a tool, and the reward weights are finite."""

from __future__ import annotations

import pytest

from lmpo.envs import make_task
from lmpo.envs.aftersales.tickets import HANDOFF, KINDS
from lmpo.envs.aftersales import verifier
from test_aftersales import _play  # one episode of scripted turns


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return make_task("aftersales").__class__(db_dir=tmp_path_factory.mktemp("company"))


def _ticket(task, kind):
    return next(p for p in task.heldout_problems(400) if p.meta["kind"] == kind)


def _total(steps) -> float:
    return round(sum(s.reward or 0.0 for s in steps), 6)


def _reference(problem) -> list[str]:
    """The right resolution, written by hand for each kind."""
    kind, order, expected = problem.meta["kind"], problem.meta["order"], problem.meta["expected"]
    policy = {"refund": "refund", "addr": "address", "cancel": "cancel"}.get(kind.split("_")[0])
    write = {"refund": lambda: f"issue_refund({order}, {expected[0][2]})",
             "addr": lambda: f"update_address({order}, {expected[0][-1]})",
             "cancel": lambda: f"cancel_order({order})"}.get(kind, str)()
    end = f"{HANDOFF}({order})" if problem.meta["handoff"] else problem.answer
    return [f"lookup_order({order})", *([f"search_policy({policy})"] if policy else []), *([write] if write else []), end]


# -- 1. a refund is paid once -----------------------------------------------------------------------------------
def test_a_second_refund_is_blocked_and_scores_below_the_right_resolution(task):
    p = _ticket(task, "refund")
    order, amount = p.meta["order"], p.meta["expected"][0][2]
    right, _ = _play(task, p, _reference(p))
    twice, env = _play(task, p, [f"lookup_order({order})", "search_policy(refund)", f"issue_refund({order}, {amount})",
                                 f"issue_refund({order}, {amount})", f"refunded ${amount}"])
    assert twice[3].messages()[0]["content"] == f"blocked: {order} has $0 left to refund"
    assert len(env.writes()) == 1 and twice[-1].info["verdict"] is True
    assert _total(twice) < _total(right)


def test_what_is_left_to_refund_falls_with_each_refund(task):
    p = _ticket(task, "refund")
    order, amount = p.meta["order"], p.meta["expected"][0][2]
    steps, env = _play(task, p, [f"lookup_order({order})", "search_policy(refund)", f"issue_refund({order}, {amount - 1})",
                                 f"issue_refund({order}, 2)", f"issue_refund({order}, 1)", f"refunded ${amount}"])
    assert [s.messages()[0]["content"] for s in steps[2:5]] == ["ok", f"blocked: {order} has $1 left to refund", "ok"]
    assert steps[-1].info["verdict"] is False  # two rows where one is expected, even though they add up


def test_without_the_guardrail_a_double_refund_fails_the_verdict(task):
    p = _ticket(task, "refund")
    order, amount = p.meta["order"], p.meta["expected"][0][2]
    unguarded = type(task)(db_dir=task.db_dir, guardrail=0)
    steps, env = _play(unguarded, p, [f"lookup_order({order})", "search_policy(refund)", f"issue_refund({order}, {amount})",
                                      f"issue_refund({order}, {amount})", f"refunded ${amount}"])
    assert len(env.writes()) == 2 and steps[-1].info["verdict"] is False


def test_the_verifier_counts_rows():
    refund = ("refund", 7, 45)
    assert verifier.verify([refund], [refund], ("$45",), "refunded $45", False).correct
    twice = verifier.verify([refund], [refund, refund], ("$45",), "refunded $45", False)
    assert not twice.correct and twice.extra == (refund,)


# -- 3. the process reward cannot be farmed ------------------------------------------------------------------------
def test_the_process_reward_pays_each_step_of_the_reference_once(task):
    p = _ticket(task, "where")
    order = p.meta["order"]
    other = "o1" if order != "o1" else "o2"
    steps, _ = _play(task, p, [f"lookup_order({order})", f"lookup_order({other})", "search_policy(refund)",
                               "search_policy(shipping)", "lookup_customer(c1)", p.answer])
    assert [s.reward for s in steps[:5]] == [task.rewards.process, None, None, None, None]
    assert steps[-1].info["verdict"] is True


def test_a_repeated_or_different_write_earns_nothing(task):
    p = _ticket(task, "addr")
    order, address = p.meta["order"], p.meta["expected"][0][4]
    right, _ = _play(task, p, _reference(p))
    steps, _ = _play(task, p, [f"lookup_order({order})", "search_policy(address)", "update_address(" + order + ", Elm 1)",
                               f"update_address({order}, {address})", f"update_address({order}, {address})", "updated"])
    assert [s.reward for s in steps[2:5]] == [task.rewards.process, None, None]
    assert steps[-1].info["verdict"] is True and _total(steps) <= _total(right)


@pytest.mark.parametrize("kind", KINDS)
def test_no_extra_call_beats_the_reference(task, kind):
    p = _ticket(task, kind)
    reference = _reference(p)
    right, _ = _play(task, p, reference)
    assert right[-1].info["verdict"] is True
    extras = ["lookup_order(o1)", "lookup_order(o2)", "lookup_customer(c1)", "search_policy(complaint)",
              "search_policy(shipping)", "search_policy(refund)", "search_policy(address)", "search_policy(cancel)"]
    padded, _ = _play(task, p, [reference[0], *extras[:6 - len(reference)], *reference[1:]])
    assert _total(padded) <= _total(right)


def test_an_unneeded_handoff_earns_no_more_than_a_wrong_reply(task):
    p = _ticket(task, "refund")
    order = p.meta["order"]
    handoff, _ = _play(task, p, [f"lookup_order({order})", "search_policy(refund)", f"{HANDOFF}({order})"])
    wrong, _ = _play(task, p, [f"lookup_order({order})", "search_policy(refund)", "refused"])
    assert handoff[-1].info["verdict"] is wrong[-1].info["verdict"] is False
    assert handoff[-1].reward == 0 and _total(handoff) <= _total(wrong)


# -- 4. replies state their facts --------------------------------------------------------------------------------
@pytest.mark.parametrize("reply, facts, ok", [
    ("refunded $12", ("$12",), True),
    ("refunded $12.", ("$12",), True),
    ("refunded $120", ("$12",), False),
    ("refunded $12 or $120", ("$12",), False),
    ("eta 3d", ("eta 3d",), True),
    ("eta 3d!", ("eta 3d",), True),
    ("eta 30d", ("eta 3d",), False),
    (" ".join(f"eta {d}d" for d in range(10)), ("eta 3d",), False),
    ("eta 3d, eta 4d", ("eta 3d",), False),
    ("refused", ("refused",), True),
    ("not refused", ("refused",), False),
    ("we have not yet refused", ("refused",), False),
    ("no, refused", ("refused",), True),
    ("refused, not refunded", ("refused",), True),
    ("refused refunded updated cancelled", ("refused",), False),
    ("refusedx", ("refused",), False),
    (None, ("refused",), False),
])
def test_reply_facts_are_whole_words_and_uncontradicted(reply, facts, ok):
    assert verifier.reply_states(reply, facts) is ok


def test_the_final_turn_grade_reads_facts_as_the_verifier_does(task):
    p = _ticket(task, "refund")
    amount = p.meta["expected"][0][2]
    assert task.grade(p, f"refunded ${amount}", True).correct
    assert not task.grade(p, f"refunded ${amount}0", True).correct
    w = _ticket(task, "where")
    assert not task.grade(w, " ".join(f"eta {d}d" for d in range(10)), True).correct


def test_a_larger_amount_in_the_reply_fails_the_verdict(task):
    p = _ticket(task, "refund")
    order, amount = p.meta["order"], p.meta["expected"][0][2]
    steps, _ = _play(task, p, [f"lookup_order({order})", "search_policy(refund)", f"issue_refund({order}, {amount})",
                               f"refunded ${amount}0"])
    assert steps[-1].info["verdict"] is False


def test_a_negated_refusal_fails_the_verdict(task):
    p = _ticket(task, "refund_late")
    steps, _ = _play(task, p, [f"lookup_order({p.meta['order']})", "not refused"])
    assert steps[-1].info["verdict"] is False


def test_a_shotgun_reply_passes_no_where_ticket(task):
    for p in [q for q in task.heldout_problems(80) if q.meta["kind"] == "where"]:
        steps, _ = _play(task, p, [" ".join(f"eta {d}d" for d in range(10))])
        assert steps[-1].info["verdict"] is False


# -- 7. reward weights are finite -----------------------------------------------------------------------------
@pytest.mark.parametrize("option", ["outcome=nan", "process=inf", "block_penalty=-inf", "handoff_cost=nan"])
def test_reward_options_must_be_finite(option):
    name, value = option.split("=")
    with pytest.raises(ValueError, match=f"aftersales option {name} must be a finite number, got {value}$"):
        make_task(f"aftersales:{option}")


# -- 11. a hand-off needs the order looked up ---------------------------------------------------------------------
def test_a_handoff_without_a_lookup_is_blocked(task):
    p = _ticket(task, "complaint")
    order = p.meta["order"]
    steps, env = _play(task, p, [f"{HANDOFF}({order})", f"lookup_order({order})", f"{HANDOFF}({order})"])
    assert steps[0].messages()[0]["content"] == f"blocked: look up {order} first" and not steps[0].done
    assert steps[0].info["counts"] == {"guardrail_blocks": 1}
    assert steps[-1].done and steps[-1].info["verdict"] is True and env.writes() == [("handoff", int(order[1:]))]


def test_every_handoff_in_the_training_data_follows_a_lookup(task):
    conversations = task.sft_demonstrations(300, 0) + task.cpt_corpus(1000, 0)
    handoffs = 0
    for c in conversations:
        said = [m["content"] for m in c if m["role"] == "assistant"]
        for i, text in enumerate(said):
            if text.startswith(HANDOFF):
                handoffs += 1
                assert f"lookup_order({text[len(HANDOFF) + 1:-1]})" in said[:i]
    assert handoffs > 100


# -- 12. bad model input is refused, not a tool crash ----------------------------------------------------------
@pytest.mark.parametrize("turn, refusal", [
    ("lookup_order(o²)", "error: unknown order 'o²'"),
    ("lookup_order(o٣)", "error: unknown order 'o٣'"),
    ("lookup_customer(c²)", "error: unknown customer 'c²'"),
    ("issue_refund(ORDER, inf)", "error: bad amount inf"),
    ("issue_refund(ORDER, nan)", "error: bad amount nan"),
    ("issue_refund(ORDER, 1e309)", "error: bad amount inf"),
])
def test_bad_model_input_is_refused_not_a_crash(task, turn, refusal):
    p = _ticket(task, "refund")
    order = p.meta["order"]
    steps, env = _play(task, p, [f"lookup_order({order})", "search_policy(refund)", turn.replace("ORDER", order)])
    assert steps[-1].messages()[0]["content"].startswith(refusal)
    assert "tool_crashes" not in steps[-1].info and env.writes() == []
