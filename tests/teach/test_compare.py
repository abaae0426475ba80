"""`lmpo compare`: budgets become each method's steps, the table and the recommendation come from
the runs' own files, and a rerun keeps what finished."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from lmpo.cli.main import main
from lmpo.teach.compare import CompareConfig
from lmpo.teach.compare.plan import Method, budget_samples, models_held, plan_method
from lmpo.teach.compare.summary import MethodSummary, Spread, recommend
from lmpo.trainers.pipeline import PipelineConfig, resolve_pipeline

PNG = b"\x89PNG\r\n\x1a\n"


def test_the_default_budget_is_what_the_pipelines_grpo_stage_samples():
    rl = resolve_pipeline(PipelineConfig(rl="grpo")).rl_stage
    assert budget_samples(CompareConfig()) == rl.steps * rl.prompts_per_step * rl.group_size == 16000


@pytest.mark.parametrize("method, unit, units, per_unit", [("grpo", "steps", 250, 64), ("ppo", "steps", 250, 64),
                                                          ("dpo", "pairs", 8000, 2), ("online_dpo", "rounds", 62, 256)])
def test_a_sample_budget_becomes_each_methods_steps(method, unit, units, per_unit):
    plan = plan_method(CompareConfig(samples=16000), Method.parse(method), seed=1)
    assert (plan.unit, plan.units, plan.samples_per_unit) == (unit, units, per_unit)
    assert 16000 - per_unit < plan.planned_samples <= 16000
    assert plan.amount == f"{units} {unit} x {per_unit}"
    one = plan_method(CompareConfig(samples=per_unit), Method.parse(method), seed=1)
    assert one.amount == f"1 {unit[:-1]} x {per_unit}"  # "1 step x 64", not "1 steps"


def test_a_compare_run_is_the_pipelines_last_stage_at_that_budget():
    """At fixed budgets: methods compared at one budget run all of it, with no stopping rules."""
    cfg = CompareConfig(samples=3200, threads=1, seeds="2")
    pipeline = resolve_pipeline(PipelineConfig(out=cfg.out, rl="ppo", seed=2, threads=1, adaptive=False))
    assert plan_method(cfg, Method.parse("ppo"), 2).pipeline == replace(
        pipeline, rl_stage=replace(pipeline.rl_stage, steps=50))
    dpo = plan_method(cfg, Method.parse("dpo:ipo"), 2).pipeline.dpo
    assert (dpo.pairs, dpo.loss, dpo.lr) == (1600, "ipo", resolve_pipeline(PipelineConfig(rl="dpo")).dpo.lr)


def test_a_time_budget_sets_each_trainers_wall_time_cap():
    cfg = CompareConfig(budget="time", minutes=2.5)
    for method in ("grpo", "dpo", "online_dpo"):
        assert plan_method(cfg, Method.parse(method), 0).stage.max_minutes == 2.5


@pytest.mark.parametrize("method, held", [
    ("ppo", ["policy", "reference", "critic"]), ("grpo", ["policy", "reference"]), ("dapo", ["policy"]),
    ("dpo", ["policy"]), ("online_dpo", ["policy", "reference"]), ("online_dpo:simpo", ["policy"])])
def test_models_held_are_read_from_the_configuration(method, held):
    assert models_held(plan_method(CompareConfig(), Method.parse(method), 0)) == held


@pytest.mark.parametrize("options, message", [
    ({"methods": "grpo,nope"}, "unknown method 'nope'"), ({"methods": "grpo:ipo"}, "dpo and online_dpo only"),
    ({"methods": "dpo:nope"}, "loss 'nope'"), ({"methods": "grpo,grpo"}, "twice"),
    ({"budget": "time"}, "--minutes"), ({"seeds": "0,x"}, "--seeds")])
def test_bad_options_are_refused_before_any_run(options, message):
    with pytest.raises(ValueError, match=message):
        cfg = CompareConfig(**options)
        cfg.validate()
        cfg.seed_list()


def _method(name, accs, seconds, mb):
    return MethodSummary(name, Spread.of(accs), Spread.of([seconds] * len(accs)), Spread.of([mb] * len(accs)),
                         Spread.of([100] * len(accs)), Spread.of([500] * len(accs)), ["policy"], "none", "", "")


def test_within_noise_the_cheapest_is_recommended():
    a, b = _method("a", [0.60, 0.62, 0.64], 100, 900), _method("b", [0.59, 0.61, 0.63], 40, 700)
    rec = recommend([a, b], Spread.of([0.3, 0.3, 0.3]))
    assert (rec.best, rec.within_noise, rec.choice) == ("a", ["a", "b"], "b")
    assert recommend([a, b], Spread.of([0.3]), budget="time").choice == "b"  # least memory
    leaner_a = _method("a", [0.60, 0.62, 0.64], 100, 500)
    rec = recommend([leaner_a, b], Spread.of([0.3]), budget="time")
    assert rec.choice == "a" and rec.lines[-1].startswith("Recommendation: a — the most accurate")


def test_a_gap_larger_than_the_spread_makes_the_best_the_choice():
    a, b = _method("a", [0.60, 0.62, 0.64], 100, 900), _method("b", [0.40, 0.41, 0.42], 40, 700)
    rec = recommend([b, a], Spread.of([0.3, 0.31, 0.32]))
    assert (rec.best, rec.beyond_noise, rec.choice) == ("a", ["b"], "a")
    assert any("more than the seeds' spread" in line for line in rec.lines)


def test_with_one_seed_no_gap_is_judged():
    rec = recommend([_method("a", [0.5], 10, 1), _method("b", [0.7], 10, 1)], Spread.of([0.3]))
    assert (rec.best, rec.undecided, rec.choice) == ("b", ["a"], "b")


def _compare(start_model, out, *extra):
    options = {"--methods": "grpo,dpo", "--seeds": "0", "--samples": "128", "--threads": "1", "--device": "cpu",
               "--start": start_model, "--out": str(out), **dict(zip(extra[::2], extra[1::2]))}  # extra overrides
    assert main(["compare", *(part for item in options.items() for part in item)]) == 0
    return json.loads((out / "compare.json").read_text())


def _set_accuracy(stage_dir: Path, accuracy: float) -> None:
    result = json.loads((stage_dir / "result.json").read_text())
    (stage_dir / "result.json").write_text(json.dumps({**result, "accuracy": accuracy}))


def test_the_table_plots_and_recommendation_come_from_the_runs(start_model, tmp_path, capsys):
    out = tmp_path / "cmp"
    first = _compare(start_model, out)
    runs = {r["method"]: r for r in first["runs"]}
    for method in ("grpo", "dpo"):
        result = json.loads((out / "seed0" / method / method / "result.json").read_text())
        assert runs[method]["accuracy"] == result["accuracy"] and runs[method]["samples"] == 128
        assert runs[method]["peak_rss_mb"] == result["peak_rss_mb"] > 0
        assert [p["samples"] for p in runs[method]["curve"]] == [0, 128]  # evaluated before and after
    grpo_config = json.loads((out / "seed0" / "grpo" / "grpo" / "result.json").read_text())["config"]
    assert grpo_config["steps"] == 2 and grpo_config["beta"] == 0.04  # 128 samples / (8 x 8), the grpo preset
    for name in ("accuracy_vs_samples.png", "accuracy_vs_time.png"):
        assert (out / name).read_bytes().startswith(PNG)
    html = (out / "compare.html").read_text()
    assert 'src="accuracy_vs_samples.png"' in html and "Recommendation" in html
    logs = {m: (out / "seed0" / m / "log.txt").stat().st_mtime_ns for m in ("grpo", "dpo")}

    _set_accuracy(out / "seed0" / "dpo" / "dpo", 0.9)  # the rerun reads the runs again, and runs nothing
    again = _compare(start_model, out)
    assert again["recommendation"]["best"] == "dpo" and "| dpo | 90.0% |" in (out / "compare.md").read_text()
    assert again["recommendation"]["lines"][0].startswith("Highest mean held-out accuracy: dpo, 90.0%")
    _set_accuracy(out / "seed0" / "grpo" / "grpo", 0.95)
    assert _compare(start_model, out)["recommendation"]["best"] == "grpo"
    assert logs == {m: (out / "seed0" / m / "log.txt").stat().st_mtime_ns for m in ("grpo", "dpo")}

    (out / "seed0" / "dpo" / "dpo" / "result.json").unlink()  # as if killed before it finished: dpo only runs again
    _compare(start_model, out)
    assert (out / "seed0" / "grpo" / "log.txt").stat().st_mtime_ns == logs["grpo"]
    assert (out / "seed0" / "dpo" / "log.txt").stat().st_mtime_ns != logs["dpo"]

    # another budget over the same --out was reported under the new header from the old runs
    argv = ["compare", "--methods", "grpo", "--seeds", "0", "--samples", "256", "--threads", "1",
            "--device", "cpu", "--start", start_model, "--out", str(out)]
    assert main(argv) == 2
    assert f"{out}/seed0/grpo: samples 128 (now 256). Use another --out" in capsys.readouterr().err
    assert _compare(start_model, out, "--methods", "grpo")["runs"][0]["samples"] == 128  # a subset: kept


def test_a_time_budget_stops_every_run_at_its_cap(start_model, tmp_path):
    out = tmp_path / "time"
    data = _compare(start_model, out, "--budget", "time", "--minutes", "0.01", "--samples", "1000000",
                    "--methods", "grpo,online_dpo")
    for run in data["runs"]:
        rows = [json.loads(line) for line in Path(run["run_dir"], "metrics.jsonl").read_text().splitlines()]
        assert any("wall-time cap of 0.01 minutes" in r.get("stopped", "") for r in rows), run["method"]
        assert 0 < run["samples"] < 1000000 and run["accuracy"] is not None
        assert run["curve"][-1]["seconds"] >= 0.6  # evaluated at the stop, after the cap


def test_a_second_compare_over_the_same_out_is_refused(start_model, tmp_path, capsys):
    """A second `lmpo compare` over a running one's --out took the runs in progress for killed
    ones and deleted them to start again."""
    import subprocess
    import sys

    out = tmp_path / "busy"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from lmpo.trainers.run_dir import "
                               f"lock_directory; lock_directory({str(out)!r}); print('held', flush=True); "
                               "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        argv = ["compare", "--methods", "grpo", "--seeds", "0", "--samples", "128", "--threads", "1",
                "--device", "cpu", "--start", start_model, "--out", str(out)]
        assert main(argv) == 2
        assert f"--out {out}: the run directory is in use by process {holder.pid}" in capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()
    assert not (out / "seed0").exists()


def test_a_runs_progress_reaches_the_terminal_while_it_trains(tmp_path):
    """Each comparison run trains in a child process writing to its log.txt; the terminal showed
    nothing for minutes. `follow` passes on the newest progress line as it appears."""
    import subprocess
    import sys

    from lmpo.teach.compare.execute import follow

    log = tmp_path / "log.txt"
    script = ("import sys, time\n"
              "for step in range(1, 4):\n"
              "    print(f'[rl] step {step}/3  reward 0.{step}  acc 0.{step}', file=sys.stderr, flush=True)\n"
              "    time.sleep(0.4)\n")
    with open(log, "w") as out:
        child = subprocess.Popen([sys.executable, "-c", script], stdout=out, stderr=subprocess.STDOUT)
        said: list[str] = []
        assert follow(child, log, said.append, every_s=0.1) == 0
    assert said and all(line.startswith("step ") and line.endswith(" s)") for line in said), said
    steps = [line.split()[1] for line in said]
    assert steps == sorted(set(steps))  # each line newer than the last, none twice


@pytest.mark.parametrize("method, per_unit", [("grpo", 64), ("online_dpo", 256), ("dpo", 2)])
def test_a_budget_below_one_unit_is_refused_naming_the_method(method, per_unit):
    with pytest.raises(ValueError, match=rf"less than one \w+ of {method}, which uses {per_unit} .*"
                                         rf"--samples {per_unit} or more"):
        plan_method(CompareConfig(samples=per_unit - 1), Method.parse(method), seed=0)
    assert plan_method(CompareConfig(samples=per_unit), Method.parse(method), seed=0).planned_samples == per_unit


def test_compare_refuses_a_tiny_budget_before_anything_runs(tmp_path, monkeypatch):
    from lmpo.teach import compare

    monkeypatch.setattr(compare, "start_model", lambda *a: pytest.fail("a run started"))
    cfg = CompareConfig(methods="grpo,dpo,online_dpo", seeds="0", samples=128, out=str(tmp_path / "cmp"))
    with pytest.raises(ValueError) as err:
        compare.run_compare(cfg, quiet=True)
    assert "online_dpo, which uses 256" in str(err.value) and "grpo" not in str(err.value).split("online_dpo")[0]
    assert not (tmp_path / "cmp").exists()


def test_a_start_directory_that_holds_no_model_is_refused_before_anything_runs(tmp_path, monkeypatch):
    from lmpo.teach import compare

    not_a_model = tmp_path / "notes"
    not_a_model.mkdir()
    (not_a_model / "README.txt").write_text("no model here")
    monkeypatch.setattr(compare, "launch", lambda *a: pytest.fail("a run was launched"))
    cfg = CompareConfig(methods="grpo", seeds="0", samples=64, start=str(not_a_model), out=str(tmp_path / "cmp"))
    with pytest.raises(FileNotFoundError, match=r"--start: .*notes is not a Hugging Face model directory"):
        compare.run_compare(cfg, quiet=True)
    assert not (tmp_path / "cmp").exists()


def test_a_best_method_below_the_start_is_not_said_to_have_gained():
    rec = recommend([_method("a", [0.298], 10, 1), _method("b", [0.2], 10, 1)], Spread.of([0.3]))
    text = "\n".join(rec.lines)
    assert "gained -" not in text and "gained" not in text
    assert "No method improved on the SFT start: the best, a, ended 0.2 points below it." in text
    assert rec.lines[-1].startswith("Recommendation: a") and "none is worth training with" in rec.lines[-1]


def test_an_exact_tie_is_not_called_a_lead():
    rec = recommend([_method("a", [0.5], 10, 1), _method("b", [0.5], 20, 1)], Spread.of([0.3]))
    text = "\n".join(rec.lines)
    assert "b: the same accuracy as a." in text and "lead" not in text
    assert rec.lines[-1] == "Recommendation: a — as accurate as b here, and the quickest of them."
    assert "gained +20.0 points over the SFT start" in text


def test_the_order_of_methods_does_not_pick_between_tied_ones():
    """One seed, grpo and dpo both at the start's 31.2%: the first listed was recommended, and
    called the cheapest in time and memory beside a dpo cheaper on both."""
    grpo, dpo = _method("grpo", [0.312], 2.35, 548), _method("dpo", [0.312], 1.92, 517)
    for order in ([grpo, dpo], [dpo, grpo]):
        rec = recommend(order, Spread.of([0.312]))
        assert (rec.choice, rec.cheapest_time, rec.cheapest_memory) == ("dpo", "dpo", "dpo")
        assert sorted(rec.within_noise) == ["dpo", "grpo"] and rec.undecided == []
        assert "Level with the best (the same accuracy): " in "\n".join(rec.lines)
        assert rec.lines[-1].startswith("Recommendation: dpo — ")
        assert "no method ended above the SFT start at this budget" in rec.lines[-1]
    leader = recommend([grpo, dpo, _method("kto", [0.2], 1.0, 400)], Spread.of([0.1]))
    assert leader.choice == "dpo" and "lead over kto is more than noise" in leader.lines[-1]


def test_the_start_row_names_what_the_runs_started_from():
    from lmpo.teach.compare.render import Comparison, table_rows

    methods = [_method("a", [0.5], 10, 1)]
    start = Spread.of([0.3])
    rec = recommend(methods, start, start_label="start model")
    assert "(start model: 30.0%)" in rec.lines[0] and "over the start model" in "\n".join(rec.lines)
    comparison = Comparison("", "sort_digits", {}, [0], start, methods, rec, [], "start model")
    assert table_rows(comparison)[0][0] == "start model"


def test_a_run_is_read_without_the_steps_a_rollback_abandoned(tmp_path):
    """A run whose collapse guard rolled steps 3–4 back was read whole: the abandoned branch's
    evaluation was a point of the curve and its samples were counted."""
    from lmpo.teach.compare.records import read_run

    rows = [{"step": 0, "eval_accuracy": 0.3}]
    rows += [{"step": s, "groups_sampled": 2, "completion_len_mean": 5.0} for s in range(1, 5)]
    rows += [{"step": 4, "eval_accuracy": 0.0}, {"step": 4, "rollback": "KL runaway", "to_step": 2, "lr_scale": 0.5}]
    rows += [{"step": s, "groups_sampled": 2, "completion_len_mean": 5.0} for s in (3, 4)]
    rows += [{"step": 4, "eval_accuracy": 0.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "result.json").write_text(json.dumps({"accuracy": 0.5, "seconds": 1.0,
                                                       "config": {"group_size": 4, "prompts_per_step": 2}}))
    record = read_run(tmp_path, "grpo", 0, "rl")
    assert [(p.samples, p.accuracy) for p in record.curve] == [(0, 0.3), (32, 0.5)]
    assert record.samples == 32 and record.completion_tokens == 4 * 5 * 2 * 4


def test_a_runs_seconds_leave_out_the_branches_a_rollback_abandoned_as_its_samples_do(tmp_path):
    """A run whose collapse guard rolled back counted the abandoned steps' wall time in its seconds
    (and in its curve's) while leaving their samples out. Rollbacks at 30 s (to the checkpoint of
    20 s) and at 60 s (to the one of 10 s, which abandons the first branch again): 50 s abandoned."""
    from lmpo.teach.compare.records import read_run

    step = {"groups_sampled": 2, "completion_len_mean": 5.0}
    rows = [{"step": 0, "eval_accuracy": 0.3, "elapsed_s": 5.0}, *({"step": s, **step} for s in range(1, 5)),
            {"step": 4, "eval_accuracy": 0.0, "elapsed_s": 28.0},
            {"step": 4, "rollback": "KL runaway", "to_step": 2, "lr_scale": 0.5, "elapsed_s": 30.0, "to_elapsed_s": 20.0},
            *({"step": s, **step} for s in (3, 4)),
            {"step": 4, "rollback": "KL runaway", "to_step": 1, "lr_scale": 0.5, "elapsed_s": 60.0, "to_elapsed_s": 10.0},
            *({"step": s, **step} for s in (2, 3, 4)), {"step": 4, "eval_accuracy": 0.5, "elapsed_s": 75.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "result.json").write_text(json.dumps({"accuracy": 0.5, "seconds": 80.0,
                                                       "config": {"group_size": 4, "prompts_per_step": 2}}))
    record = read_run(tmp_path, "grpo", 0, "rl")
    assert record.samples == 32 and record.seconds == 30.0 and record.abandoned_seconds == 50.0
    assert [(p.samples, p.seconds, p.accuracy) for p in record.curve] == [(0, 5.0, 0.3), (32, 25.0, 0.5)]


def test_a_method_that_trained_no_step_on_some_seeds_is_marked_and_still_ranked():
    from lmpo.teach.compare.render import _no_steps_mark

    def summary(name, accs, none=()):
        return MethodSummary(name, Spread.of(accs), Spread(10.0, None, 2), Spread(100.0, None, 2),
                             Spread(0, None, 2), Spread(0, None, 2), [], "", "", "", [0, 1], list(none))

    dpo, grpo = summary("dpo", [0.5, 0.2], none=[1]), summary("grpo", [0.3, 0.3])
    rec = recommend([dpo, grpo], Spread.of([0.2, 0.2]), "time", minutes=2)
    assert rec.best == "dpo" and _no_steps_mark(dpo) == " (1 of 2 seeds: 0 steps)"
    assert any(line.startswith("dpo: trained 0 steps on seed 1: its reference log-prob pass alone took longer than "
                               "--minutes 2") for line in rec.lines)
    every = summary("dpo", [0.9, 0.9], none=[0, 1])  # trained nothing anywhere: not ranked above one that trained
    assert recommend([every, grpo], Spread.of([0.2, 0.2]), "time", minutes=2).best == "grpo"


def test_methods_as_quick_as_shown_are_said_to_tie():
    """Two methods at the same rounded seconds: one was called "the quickest" by a fraction of a
    second the table does not show."""
    a, b = _method("a", [0.60, 0.62, 0.64], 40.4, 900), _method("b", [0.59, 0.61, 0.63], 40.2, 700)
    rec = recommend([a, b], Spread.of([0.3, 0.3, 0.3]))
    assert "least wall time: b, a, tied (40 s)" in rec.lines[-2]
    assert rec.lines[-1] == ("Recommendation: b — as accurate as a within noise, and tied with a for the quickest "
                             "of those.")  # the leaner of the two
    zh = recommend([a, b], Spread.of([0.3, 0.3, 0.3]), lang="zh")
    assert "耗时最少：b、a 并列（40 秒）" in zh.lines[-2] and "与 a 并列最快的" in zh.lines[-1]
    c = _method("c", [0.59, 0.61, 0.63], 39.4, 950)  # a whole second quicker as shown: the quickest alone
    assert recommend([a, c], Spread.of([0.3, 0.3, 0.3])).lines[-1].endswith("and the quickest of those.")


def test_a_yaml_list_in_the_config_is_a_list(tmp_path):
    """`methods: [grpo, dpo]` in --config was refused as "unknown method '["grpo"'" (the list reached
    the option as JSON text and was split at its commas)."""
    from lmpo.cli.config import build

    config = tmp_path / "c.yaml"
    config.write_text("methods: [grpo, 'dpo:ipo']\nseeds: [0, 1]\n")
    cfg = build(CompareConfig, yaml_file=str(config), flags={})
    assert (cfg.method_names(), cfg.seed_list()) == (["grpo", "dpo:ipo"], [0, 1])
    assert CompareConfig(methods="grpo, dpo").method_names() == ["grpo", "dpo"]  # the flag's form as it was
