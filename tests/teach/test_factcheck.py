"""`lmpo factcheck`: the exact claims' verdicts, the report's shape, verdicts that follow the evidence."""

from __future__ import annotations

import json
import string
from dataclasses import replace

import pytest

from lmpo.teach.factcheck import CLAIMS, DEPENDS, FAILS, HOLDS, FactcheckOptions, run_factcheck, select
from lmpo.teach.factcheck.core import Claim, fill
from lmpo.teach.factcheck.report import write_outputs
from lmpo.teach.factcheck.zh import CLAIMS_ZH, UI_ZH, VERDICTS_ZH
from lmpo.teach.factcheck.texts import UI_EN, VERDICTS_EN

BY_NAME = {c.name: c for c in CLAIMS}
# exact computations: their verdicts are fixed by the math (and by lmpo's functions being right)
EXPECTED = {**{c.name: HOLDS for c in CLAIMS if c.fast}, "k3_loss_minimises_kl": FAILS}


@pytest.fixture(scope="module")
def fast_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("factcheck")
    return run_factcheck(FactcheckOptions(fast=True, out=str(out), threads=1)), out


def test_enough_claims_and_the_fast_ones_are_exact():
    assert len(CLAIMS) >= 15
    assert len({c.name for c in CLAIMS}) == len(CLAIMS)
    assert sum(c.fast for c in CLAIMS) >= 8 and sum(not c.fast for c in CLAIMS) >= 8
    for claim in CLAIMS:
        assert claim.papers and all("arXiv:" in p or "http" in p for p in claim.papers), claim.name


def test_exact_claims_verdicts_with_all_their_numbers(fast_report):
    report, _ = fast_report
    assert [o.claim.name for o in report.outcomes] == [c.name for c in CLAIMS if c.fast]
    for outcome in report.outcomes:
        assert outcome.error == "", f"{outcome.claim.name}: {outcome.error}"
        assert outcome.verdict == EXPECTED[outcome.claim.name], f"{outcome.claim.name}: {outcome.verdict} ({outcome.note})"
        # every field of the templates was measured
        for template in (outcome.claim.summary, outcome.claim.notes[outcome.note]):
            assert "?" not in fill(template, outcome.values).replace("?)", ""), outcome.claim.name


def test_json_and_html_shape(fast_report):
    report, out = fast_report
    data = json.loads((out / "factcheck.json").read_text())
    assert data["fast_only"] is True and data["counts"][FAILS] == 1 and data["counts"][HOLDS] == len(report.outcomes) - 1
    record = data["claims"][0]
    assert set(record) >= {"number", "name", "claim", "papers", "criterion", "verdict", "verdict_text", "note",
                           "summary", "evidence", "seconds", "plot", "fast"}
    with_plots = [r for r in data["claims"] if r["plot"]]
    assert with_plots and all((out / r["plot"]).is_file() for r in with_plots)
    html = (out / "factcheck.html").read_text()
    assert html.count("<section id=") == len(report.outcomes)
    assert html.count("data:image/png;base64,") == len(with_plots)
    assert "https://arxiv.org/abs/2402.03300" in html and ">holds<" in html and ">does not hold<" in html


def test_chinese_report_uses_the_zh_table(fast_report, tmp_path):
    report, _ = fast_report
    write_outputs(replace(report, lang="zh"), tmp_path)
    html = (tmp_path / "factcheck.html").read_text()
    data = json.loads((tmp_path / "factcheck.json").read_text())
    assert '<html lang="zh">' in html and VERDICTS_ZH[HOLDS] in html and UI_ZH["criterion"] in html
    first = data["claims"][0]
    assert first["claim"] == CLAIMS_ZH[first["name"]]["text"] and first["verdict"] == HOLDS


def _fields(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def test_zh_table_matches_the_english_templates():
    assert set(CLAIMS_ZH) == set(BY_NAME)
    assert set(UI_ZH) == set(UI_EN) and set(VERDICTS_ZH) == set(VERDICTS_EN)
    for name, zh in CLAIMS_ZH.items():
        claim: Claim = BY_NAME[name]
        assert set(zh["notes"]) == set(claim.notes), name
        assert _fields(zh["criterion"]) == _fields(claim.criterion), name
        assert _fields(zh["summary"]) == _fields(claim.summary), name
        for key, note in claim.notes.items():
            assert _fields(zh["notes"][key]) == _fields(note), (name, key)
        assert not _fields(zh["text"]) and any("\u4e00" <= ch <= "\u9fff" for ch in zh["text"]), name


def test_verdicts_follow_the_evidence():
    """The same judges, fed numbers that came out the other way, change their verdicts."""
    zero = BY_NAME["zero_var_no_gradient"]
    good = {"grad_beta0": 0.0, "grad_beta_ref_is_policy": 0.0, "grad_beta_ref_differs": 0.07,
            "grad_mixed_rewards": 4.5}
    assert zero.judge(good, zero.limits).verdict == HOLDS
    assert zero.judge({**good, "grad_beta0": 1e-3}, zero.limits).verdict == FAILS
    assert zero.judge({**good, "grad_mixed_rewards": 0.0}, zero.limits).verdict == DEPENDS

    beta = BY_NAME["beta_keeps_close"]
    closer = {"kl_low": 0.4, "kl_high": 0.1, "kl_diff_se": 10.0}
    assert beta.judge(closer, beta.limits).verdict == HOLDS
    assert beta.judge({"kl_low": 0.1, "kl_high": 0.4, "kl_diff_se": -10.0}, beta.limits).verdict == FAILS
    assert beta.judge({"kl_low": 0.4, "kl_high": 0.39, "kl_diff_se": 0.3}, beta.limits).verdict == DEPENDS

    clip = BY_NAME["clip_higher_entropy"]
    collapsed = {"clip_base": 0.05, "entropy_start": 0.5, "entropy_base_end": 0.1}
    assert clip.judge({**collapsed, "ratio_min": 1.2, "ratio_max": 1.3}, clip.limits).verdict == HOLDS
    assert clip.judge({**collapsed, "ratio_min": 0.9, "ratio_max": 1.1}, clip.limits).verdict == DEPENDS
    assert clip.judge({**collapsed, "ratio_min": 0.7, "ratio_max": 0.8}, clip.limits).verdict == FAILS
    no_collapse = {**collapsed, "entropy_base_end": 0.6, "ratio_min": 1.2, "ratio_max": 1.3}
    assert clip.judge(no_collapse, clip.limits).note == "no_collapse"

    online = BY_NAME["online_beats_offline_dpo"]
    assert online.judge({"diff_se": 3.0}, online.limits).verdict == HOLDS
    assert online.judge({"diff_se": -3.0}, online.limits).verdict == FAILS
    assert online.judge({"diff_se": 0.5}, online.limits).verdict == DEPENDS

    breadth = BY_NAME["rl_sharpens_not_widens"]
    sharper = {"samples": 64, "base_pass1": 0.27, "rl_pass1": 0.55, "base_pass64": 0.93, "rl_pass64": 0.925}
    assert breadth.judge({**sharper, "sft_pass64": 0.6}, breadth.limits).note == "sharpened"
    assert breadth.judge({**sharper, "sft_pass64": 0.95}, breadth.limits).note == "sharpened_only"
    assert breadth.judge({**sharper, "rl_pass64": 0.96}, breadth.limits).verdict == FAILS
    assert breadth.judge({**sharper, "rl_pass1": 0.275}, breadth.limits).verdict == DEPENDS

    hack = BY_NAME["reward_model_hacking"]
    hacked = {"plain_hacked": 1, "eos_hacked": 0, "probe_open": 0.4, "probe_closed": 0.0}
    assert hack.judge(hacked, hack.limits).verdict == HOLDS
    assert hack.judge({**hacked, "plain_hacked": 0}, hack.limits).verdict == DEPENDS
    assert hack.judge({**hacked, "probe_closed": 0.2}, hack.limits).verdict == FAILS


def test_selection():
    assert [c.name for c in select("ipo_target_margin,kl_estimators")] == ["kl_estimators", "ipo_target_margin"]
    assert all(c.fast for c in select(fast=True))
    with pytest.raises(ValueError, match="unknown claim"):
        select("no_such_claim")


def test_cli_command_is_registered(capsys):
    from lmpo.cli.main import main

    assert main(["factcheck", "--list"]) == 0
    listed = capsys.readouterr().out
    assert all(c.name in listed for c in CLAIMS)
    from lmpo.teach.factcheck.texts import claim_texts

    assert main(["factcheck", "--list", "--lang", "zh"]) == 0  # it listed in English whatever --lang said
    listed = capsys.readouterr().out
    assert all(claim_texts(c, "zh")["text"] in listed for c in CLAIMS) and "训练实验" in listed
    with pytest.raises(SystemExit):
        main(["factcheck", "--lang", "fr"])


def test_one_claim_is_not_called_1_claims(tmp_path):
    from lmpo.teach.factcheck.report import claims
    from lmpo.teach.factcheck.texts import UI_EN

    assert (claims(UI_EN, 1), claims(UI_EN, 16)) == ("1 claim", "16 claims")
    assert (claims(UI_ZH, 1), claims(UI_ZH, 16)) == ("1 条说法", "16 条说法")
    report = run_factcheck(FactcheckOptions(fast=True, only="gspo_geometric_mean", out=str(tmp_path), threads=1))
    html = (tmp_path / "factcheck.html").read_text()
    assert len(report.outcomes) == 1 and "<p>1 claim, each measured" in html and "1 claims" not in html


def test_progress_lines_are_in_the_report_language(fast_report, capsys):
    # `lmpo factcheck --lang zh` printed its progress lines in English beside a Chinese table
    from lmpo.teach.factcheck import progress_line

    report, _ = fast_report
    outcome = report.outcomes[0]
    progress_line(1, 3, outcome, "zh")
    progress_line(1, 3, outcome)
    zh, en = capsys.readouterr().err.splitlines()
    assert zh.startswith(f"[factcheck] 1/3 {outcome.claim.name}：{VERDICTS_ZH[outcome.verdict]}") and zh.endswith(" 秒")
    assert en.startswith(f"[factcheck] 1/3 {outcome.claim.name}: {VERDICTS_EN[outcome.verdict]}") and en.endswith(" s")


def test_an_out_with_runs_or_plots_no_factcheck_wrote_is_refused_not_deleted(tmp_path, capsys):
    """`lmpo factcheck --out .` deleted ./runs (lmpo compare's runs/compare, an exercise's runs)
    and the user's ./plots, even for a claim that trains nothing."""
    from lmpo.cli.main import main

    (tmp_path / "runs" / "compare").mkdir(parents=True)
    (tmp_path / "runs" / "compare" / "compare.json").write_text("precious")
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "mine.png").write_text("mine")
    assert main(["factcheck", "--only", "gspo_geometric_mean", "--out", str(tmp_path), "--threads", "1"]) == 2
    assert "holds runs/, plots/ that no factcheck wrote" in capsys.readouterr().err
    assert (tmp_path / "runs" / "compare" / "compare.json").read_text() == "precious"
    assert (tmp_path / "plots" / "mine.png").read_text() == "mine" and not (tmp_path / "factcheck.json").exists()
    afile = tmp_path / "afile"
    afile.write_text("")
    assert main(["factcheck", "--only", "gspo_geometric_mean", "--out", str(afile), "--threads", "1"]) == 2
    assert "is a file; give a directory" in capsys.readouterr().err


def test_a_second_factcheck_replaces_the_firsts_plots(tmp_path):
    out = tmp_path / "fc"
    run_factcheck(FactcheckOptions(fast=True, only="kl_estimators", out=str(out), threads=1))
    assert (out / "plots" / "kl_estimators.png").exists()
    run_factcheck(FactcheckOptions(fast=True, only="gspo_geometric_mean", out=str(out), threads=1))
    assert not (out / "plots" / "kl_estimators.png").exists()


def test_kl_estimators_judges_k1s_bias_too():
    """k1 was called unbiased, but its z was shown and never judged: a biased k1 still got "holds"."""
    claim = BY_NAME["kl_estimators"]
    fine = {"k3_max_z": 1.0, "k3_min": 0.0, "k1_max_z": 1.2, "k1_min": -2.0, "k2_max_z": 30.0}
    assert claim.judge(fine, claim.limits).verdict == HOLDS
    biased = claim.judge({**fine, "k1_max_z": 9.0}, claim.limits)
    assert (biased.verdict, biased.note) == (FAILS, "k1_off")
    assert "k1" in claim.criterion.split("standard errors")[1]


def test_dpo_weight_note_says_the_weight_fades_not_stops():
    for text in (BY_NAME["dpo_weight_sigmoid"].notes["sigmoid"], CLAIMS_ZH["dpo_weight_sigmoid"]["notes"]["sigmoid"]):
        assert "stops pushing" not in text and "不再推" not in text
        assert "never reaches 0" in text or "永远不会到 0" in text


@pytest.mark.parametrize("lang, said", [("en", "skipped grpo_no_critic: training experiments, which --fast leaves out"),
                                        ("zh", "已跳过 grpo_no_critic：它们是训练实验")])
def test_only_with_fast_says_which_named_claims_it_skips(tmp_path, capsys, lang, said):
    """`--only kl_estimators,grpo_no_critic --fast` ran one claim and said nothing of the other."""
    from lmpo.cli.main import main

    assert not BY_NAME["grpo_no_critic"].fast and BY_NAME["ppo_clip_lower_bound"].fast
    argv = ["factcheck", "--only", "ppo_clip_lower_bound,grpo_no_critic", "--fast", "--threads", "1",
            "--out", str(tmp_path / lang), "--lang", lang]
    assert main(argv) == 0
    assert said in capsys.readouterr().err
    assert main([*argv[:2], "grpo_no_critic", *argv[3:]]) == 2
    refused = {"en": "--fast leaves out grpo_no_critic", "zh": "--fast 去掉了 grpo_no_critic"}[lang]
    assert refused in capsys.readouterr().err
