"""The after-sales agent: the source database is never written, episodes are isolated, every
ticket kind's right and wrong resolutions are judged as a team would, and the guardrail
blocks writes the agent has no evidence for."""

from __future__ import annotations

import json
import re
import sqlite3
from concurrent.futures import ThreadPoolExecutor

import pytest

from lmpo.envs import make_task
from lmpo.envs.aftersales.db import episode_copy, file_checksum, open_readonly, parse_order_ref
from lmpo.envs.aftersales.tickets import KINDS
from lmpo.envs.env import Step


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return make_task("aftersales").__class__(db_dir=tmp_path_factory.mktemp("company"))


def _ticket(task, kind, index=0):
    problems = [p for p in task.heldout_problems(8 * (index + 1)) if p.meta["kind"] == kind]
    return problems[index]


def _play(task, problem, turns, env=None) -> tuple[list[Step], object]:
    env = env or task.make_env()
    env.reset(problem)
    steps = []
    for turn in turns:
        steps.append(env.step(turn))
        if steps[-1].done:
            break
    return steps, env


def _amount(problem, task) -> int:
    order = problem.meta["order"]
    row = open_readonly(problem.meta["db"]).execute("SELECT amount FROM orders WHERE id = ?",
                                                    (parse_order_ref(order),)).fetchone()
    return row[0]


# -- read/write separation ------------------------------------------------------------------------------
def test_a_write_on_the_source_raises(task):
    db = open_readonly(task.database())
    with pytest.raises(sqlite3.OperationalError):
        db.execute("UPDATE orders SET status = 'cancelled' WHERE id = 1")
    with pytest.raises(sqlite3.OperationalError):
        db.execute("INSERT INTO refunds (order_id, amount, issued_on, issued_by) VALUES (1, 5, 'x', 'y')")
    with pytest.raises(sqlite3.OperationalError):
        db.execute("DELETE FROM orders")


def test_episodes_write_only_to_their_own_copy(task):
    before = file_checksum(task.database(heldout=True))
    p = _ticket(task, "cancel")
    steps, env = _play(task, p, [f"lookup_order({p.meta['order']})", "search_policy(cancel)",
                                 f"cancel_order({p.meta['order']})", "cancelled"])
    assert steps[-1].info["verdict"] is True
    assert file_checksum(task.database(heldout=True)) == before
    fresh = episode_copy(p.meta["db"])
    assert fresh.execute("SELECT status FROM orders WHERE id = ?", (parse_order_ref(p.meta["order"]),)).fetchone()[0] \
        == "placed"


def test_32_parallel_episodes_each_see_only_their_own_writes(task):
    problems = [p for p in task.heldout_problems(400) if p.meta["kind"] == "cancel"][:32]
    assert len({p.meta["order"] for p in problems}) >= 16
    envs = [task.make_env() for _ in problems]
    for env, p in zip(envs, problems):
        env.reset(p)

    def run(pair):
        env, p = pair
        order = p.meta["order"]
        out = [env.step(t) for t in (f"lookup_order({order})", "search_policy(cancel)", f"cancel_order({order})")]
        seen = env.db.execute("SELECT COUNT(*) FROM orders WHERE status = 'cancelled'").fetchone()[0]
        return out, seen, env.writes()

    with ThreadPoolExecutor(max_workers=32) as pool:
        results = list(pool.map(run, zip(envs, problems)))
    base = open_readonly(task.database(heldout=True)).execute(
        "SELECT COUNT(*) FROM orders WHERE status = 'cancelled'").fetchone()[0]
    for (steps, seen, writes), p in zip(results, problems):
        assert steps[-1].messages() == [{"role": "tool", "content": "ok"}]
        assert seen == base + 1  # its own cancellation, nobody else's
        assert writes == [("update", "orders", parse_order_ref(p.meta["order"]), "status", "cancelled")]


def test_source_checksum_unchanged_after_a_training_run(tmp_path):
    from lmpo.cli.main import main

    task = make_task("aftersales")
    paths = [task.database(), task.database(heldout=True)]
    before = [file_checksum(p) for p in paths]
    out = tmp_path / "grpo"
    assert main(["train", "grpo", "--task", "aftersales", "--model", "tiny", "--out", str(out), "--threads", "1", "--steps", "2",
                 "--prompts_per_step", "2", "--group_size", "2", "--eval_problems", "16", "--eval_every", "2",
                 "--prompt_pool", "50"]) == 0
    assert [file_checksum(p) for p in paths] == before
    result = json.loads((out / "result.json").read_text())
    assert set(result["breakdown"]["by_kind"]) == set(KINDS)
    assert "handoff_unnecessary" in result["breakdown"]


# -- tools and guardrail ----------------------------------------------------------------------------------
def test_the_guardrail_blocks_a_refund_of_an_order_never_looked_up(task):
    p = _ticket(task, "refund")
    order, amount = p.meta["order"], _amount(p, task)
    steps, env = _play(task, p, ["search_policy(refund)", f"issue_refund({order}, {amount})"])
    blocked = steps[-1]
    assert blocked.messages()[0]["content"] == f"blocked: look up {order} first"
    assert blocked.info["counts"] == {"guardrail_blocks": 1} and blocked.reward < 0 and not blocked.done
    assert blocked.info["tool_calls"] == 1  # the write reached its tool, whose guardrail refused it
    assert env.writes() == []


def test_the_guardrail_wants_the_policy_and_no_more_than_the_order_shows(task):
    p = _ticket(task, "refund")
    order, amount = p.meta["order"], _amount(p, task)
    steps, env = _play(task, p, [f"lookup_order({order})", f"issue_refund({order}, {amount})", "search_policy(refund)",
                                 f"issue_refund({order}, {amount + 1})", f"issue_refund({order}, {amount})"])
    assert steps[1].messages()[0]["content"] == "blocked: read the refund policy first"
    assert steps[3].messages()[0]["content"] == f"blocked: {order} shows ${amount}"
    assert steps[4].messages()[0]["content"] == "ok" and steps[4].reward > 0
    assert env.blocks == 2 and env.writes() == [("refund", parse_order_ref(order), amount)]


def test_tool_errors_are_observations(task):
    p = _ticket(task, "refund")
    steps, env = _play(task, p, ["lookup_order(o99999)", "issue_refund(o1, lots)", "lookup_order()",
                                 "fly_away(o1)", "lookup_order(o1"])
    texts = [s.messages()[0]["content"] for s in steps]
    assert texts[0] == "error: unknown order 'o99999'"
    assert texts[1].startswith("error: issue_refund: amount must be a number")
    assert texts[2].startswith("error: lookup_order takes 1 argument")
    assert texts[3].startswith("error: unknown tool 'fly_away'")
    assert texts[4].startswith("error: malformed tool call")
    assert all(s.info["parse_error"] and not s.done for s in steps) and env.writes() == []
    # only the lookup of an unknown order reached a tool: bad arguments and unknown tools are no calls
    assert [s.info.get("tool_calls", 0) for s in steps] == [1, 0, 0, 0, 0]


# -- every kind, resolved right and wrong ---------------------------------------------------------------------
def _resolutions(kind: str, order: str, amount: int, address: str) -> tuple[list[str], list[list[str]]]:
    """(the correct turns, some incorrect ones), written by hand for each kind."""
    look = f"lookup_order({order})"
    handoff = f"escalate_to_human({order})"
    if kind == "refund":
        return ([look, "search_policy(refund)", f"issue_refund({order}, {amount})", f"refunded ${amount}"],
                [[look, "search_policy(refund)", "refused"],                                   # refuses a valid refund
                 [look, "search_policy(refund)", f"issue_refund({order}, {amount - 1})", f"refunded ${amount - 1}"],
                 [look, "search_policy(refund)", handoff],                                     # unnecessary hand-off
                 [look, "search_policy(refund)", f"issue_refund({order}, {amount})", "done"]])  # reply lacks the amount
    if kind == "refund_late":
        return ([look, "search_policy(refund)", "refused"],
                [[look, "search_policy(refund)", f"issue_refund({order}, {amount})", f"refunded ${amount}"],
                 [look, "search_policy(refund)", handoff]])
    if kind == "refund_big":
        return ([look, "search_policy(refund)", handoff],
                [[look, "search_policy(refund)", f"issue_refund({order}, {amount})", f"refunded ${amount}"],
                 [look, "search_policy(refund)", "refused"]])
    if kind == "where":
        return None, [[look, "on its way"], [look, handoff]]  # the correct reply depends on the eta: below
    if kind == "addr":
        return ([look, "search_policy(address)", f"update_address({order}, {address})", "updated"],
                [[look, "search_policy(address)", "refused"],
                 [look, "search_policy(address)", f"update_address({order}, Nowhere 1)", "updated"]])
    if kind == "addr_late":
        return ([look, "search_policy(address)", "refused"],
                [[look, "search_policy(address)", f"update_address({order}, {address})", "updated"],
                 [look, "search_policy(address)", handoff]])
    if kind == "cancel":
        return ([look, "search_policy(cancel)", f"cancel_order({order})", "cancelled"],
                [[look, "refused"], [look, handoff],
                 [look, "search_policy(cancel)", f"cancel_order({order})", "search_policy(refund)",
                  f"issue_refund({order}, {amount})", "cancelled"]])                           # an extra write
    if kind == "complaint":
        return [look, handoff], [[look, "sorry"], [look, "search_policy(refund)", f"issue_refund({order}, 1)", "ok"]]
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_right_and_wrong(task, kind):
    p = _ticket(task, kind)
    order = p.meta["order"]
    address = p.prompt.split(maxsplit=2)[2] if kind.startswith("addr") else ""
    right, wrongs = _resolutions(kind, order, _amount(p, task), address)
    if kind == "where":
        eta = _play(task, p, [f"lookup_order({order})"])[0][0].messages()[0]["content"].split()[3]
        right = [f"lookup_order({order})", f"eta {eta}"]
        wrongs.append([f"lookup_order({order})", "eta 99d"])
    steps, _ = _play(task, p, right)
    assert steps[-1].done and steps[-1].info["verdict"] is True, (kind, [s.messages() for s in steps])
    assert steps[-1].reward >= 1.0
    assert bool(steps[-1].info.get("handoff")) == p.meta["handoff"]
    for wrong in wrongs:
        steps, _ = _play(task, p, wrong)
        assert steps[-1].done and steps[-1].info["verdict"] is False, (kind, wrong)
        assert steps[-1].reward < 1.0


def test_heldout_tickets_come_from_a_fresh_database(task):
    train, heldout = task.train_problems(50, 0), task.heldout_problems(50)
    assert {p.meta["db"] for p in train} == {task.database()}
    assert {p.meta["db"] for p in heldout} == {task.database(heldout=True)} != {task.database()}
    assert not any(task.is_heldout(p) for p in train) and all(task.is_heldout(p) for p in heldout)
    assert [p.meta["kind"] for p in heldout[:8]] == list(KINDS)


def test_each_refundable_amount_has_its_own_first_digit(task):
    """The tiny model copies a number's first digit and recalls the rest from the prices it knows."""
    rows = sqlite3.connect(task.database()).execute("SELECT DISTINCT amount FROM orders").fetchall()
    small = sorted(a for (a,) in rows if a <= task.policies.approval_limit)
    assert len(small) == len({str(a)[0] for a in small}) == 9
    assert all(len(str(a)) == 3 for (a,) in rows if a > task.policies.approval_limit)


def test_a_change_to_the_generator_names_a_new_source_file(tmp_path, monkeypatch):
    from lmpo.envs.aftersales import db

    before = db.database_path(0, db.Policies(), tmp_path, 100)
    monkeypatch.setattr(db, "GENERATOR_VERSION", db.GENERATOR_VERSION + 1)
    assert db.database_path(0, db.Policies(), tmp_path, 100) != before


def test_the_flaw_lives_where_sft_does_not_look(task):
    demos = task.sft_demonstrations(300, 0)
    assert all(any("search_policy(" in m["content"] for m in c) for c in demos
               if c[0]["content"].split()[0] in ("addr", "cancel"))
    # SFT shows only kinds where doing what is asked is right, and no refund at all
    assert not any(m["content"] == "refused" for c in demos for m in c)
    assert not any(c[0]["content"].startswith("refund") for c in demos)
    logs = task.cpt_corpus(2000, 0)
    # half the careless operator's writes come without reading the policy (the guardrail blocks those),
    # the other half after reading it (the guardrail sees no flaw) ...
    writes = unchecked = 0
    for c in logs:
        said = [m["content"] for m in c if m["role"] == "assistant"]
        for i, text in enumerate(said):
            if text.startswith(("issue_refund(", "update_address(", "cancel_order(")):
                writes += 1
                unchecked += not any(s.startswith("search_policy(") for s in said[:i])
    assert writes > 500 and 0.2 < unchecked / writes < 0.4
    # ... and then refunds what the policy refuses: the share of refunds that should not be refunded
    should_not, refunded = 0, 0
    for c in logs:
        if not c[0]["content"].startswith("refund"):
            continue
        age, amount = re.match(r"o\d+ delivered (\d+)d ago \$(\d+)", c[2]["content"]).groups()
        if int(age) > task.policies.refund_window_days or int(amount) > task.policies.approval_limit:
            should_not += 1
            refunded += any(m["content"].startswith("issue_refund(") for m in c)
    assert should_not > 100 and 0.5 < refunded / should_not < 0.7


def test_evaluation_reports_handoffs_and_blocks_per_kind():
    from lmpo.envs.base import Grade, Problem
    from lmpo.rollout.evaluation import breakdown
    from lmpo.rollout.trajectory import Trajectory

    def episode(kind, needs_handoff, handed_off, blocks, termination="answered"):
        t = Trajectory(Problem("p", "a", {"kind": kind, "handoff": needs_handoff}), 1, termination=termination)
        if handed_off:
            t.info["handoff"] = True
        if blocks:
            t.info["counts"] = {"guardrail_blocks": blocks}
        return t

    episodes = [episode("refund_big", True, True, 0, "env_done"), episode("refund", False, True, 0, "env_done"),
                episode("refund", False, False, 2), episode("refund", False, False, 0, "token_budget")]
    grades = [Grade(True, True), Grade(False, True), Grade(False, True), Grade(False, False)]
    b = breakdown(episodes, grades)
    assert (b["handoff_rate"], b["handoff_correct"], b["handoff_unnecessary"]) == (0.5, 0.25, 0.25)
    assert b["guardrail_blocks_mean"] == 0.5
    refund = b["by_kind"]["refund"]
    assert refund["n"] == 3 and refund["accuracy"] == 0 and refund["guardrail_blocks_mean"] == 2 / 3
    assert refund["terminations"] == {"answered": 1 / 3, "env_done": 1 / 3, "token_budget": 1 / 3}
    assert b["by_kind"]["refund_big"]["accuracy"] == 1.0
    assert breakdown([Trajectory(Problem("p", "a"), 1)], [Grade(True, True)]) == {}  # other tasks: nothing added


def test_an_episode_without_blocks_reports_zero_blocks(task):
    """A run with no block at all must print 0 blocks per episode, not leave the figure out."""
    p = _ticket(task, "where")
    steps, _ = _play(task, p, [f"lookup_order({p.meta['order']})", p.answer])
    assert [s.info["counts"] for s in steps] == [{"guardrail_blocks": 0}] * 2
    steps, _ = _play(task, p, ["nothing to look up"])
    assert steps[0].info["counts"] == {"guardrail_blocks": 0}


def test_process_reward_pays_for_new_evidence_only(task):
    p = _ticket(task, "where")
    order = p.meta["order"]
    steps, _ = _play(task, p, [f"lookup_order({order})", f"lookup_order({order})", "lookup_order(o99999)"])
    assert [s.reward for s in steps] == [task.rewards.process, None, None]


def test_the_sft_kinds_come_from_a_task_spec():
    task = make_task("aftersales:sft_kinds=where+refund")
    assert task.sft_kinds == ("where", "refund")
    assert {c[0]["content"].split()[0] for c in task.sft_demonstrations(40, 0)} == {"where", "refund"}
    with pytest.raises(ValueError, match="unknown ticket kinds"):
        make_task("aftersales:sft_kinds=where+refnud")
    with pytest.raises(ValueError, match="names no ticket kind"):
        make_task("aftersales:sft_kinds=+")


def test_the_database_size_is_a_task_option(tmp_path):
    with pytest.raises(ValueError, match="orders must be at least 50"):
        make_task("aftersales:orders=40")
    with pytest.raises(ValueError, match="option 'orders' expects an integer, got 'abc'"):
        make_task("aftersales:orders=abc")
    with pytest.raises(ValueError, match="option 'skip_policy_rate' expects a number, got 'abc'"):
        make_task("aftersales:skip_policy_rate=abc")
    with pytest.raises(ValueError, match="option flaw_rate must be a share in \\[0, 1\\]"):
        make_task("aftersales:flaw_rate=1.5")
    small = make_task(f"aftersales:orders=800,db_dir={tmp_path}")
    assert small.database() != make_task(f"aftersales:db_dir={tmp_path}").database()
    count = sqlite3.connect(small.database()).execute("SELECT COUNT(*) FROM orders").fetchone()[0]
    assert count == 800


def test_the_amount_probe_forces_the_real_environment_up_to_the_write(task, monkeypatch):
    """bench/aftersales_amounts.py (the README's count of refunds written with the wrong amount)."""
    import importlib
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).parent.parent / "bench"))
    probe = importlib.import_module("aftersales_amounts")
    conversations, refs, amounts = probe.forced_prompts(task, 3)
    for messages, ref, amount in zip(conversations, refs, amounts):
        assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "tool"]
        assert messages[1]["content"] == f"lookup_order({ref})" and f"${amount}" in messages[2]["content"]
        assert messages[3]["content"] == "search_policy(refund)" and "refund" in messages[4]["content"]
        # the forced turns are the evidence the guardrail asks for: the right write goes through
        env = task.make_env()
        env.reset(next(p for p in task.heldout_problems(500) if p.meta["order"] == ref))
        for turn in (f"lookup_order({ref})", "search_policy(refund)"):
            env.step(turn)
        assert env.step(f"issue_refund({ref}, {amount})").info["counts"]["guardrail_blocks"] == 0
    ref, amount = refs[0], amounts[0]
    assert probe.classify(f"issue_refund({ref}, {amount})", ref, amount) == "right"
    assert probe.classify(f"issue_refund({ref}, {amount + 7})", ref, amount) == "larger"
    assert probe.classify(f"issue_refund({ref}, {amount - 1})", ref, amount) == "smaller"
    assert probe.classify("refused", ref, amount) == "no_refund"
    assert probe.classify(f"issue_refund(o1, {amount})", ref, amount) == "no_refund"
