"""`lmpo factcheck`: claims the field repeats, each checked by a small experiment or an exact
computation with lmpo's own functions and trainers, with a verdict computed from the evidence.

    from lmpo.teach.factcheck import FactcheckOptions, run_factcheck
    report = run_factcheck(FactcheckOptions(fast=True, out="factcheck"))
"""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from lmpo.teach.factcheck import breadth, clipping, hacking, kl, length, preference, sampling, signal
from lmpo.teach.factcheck.context import Context
from lmpo.teach.factcheck.core import DEPENDS, ERROR, FAILS, HOLDS, Claim, Outcome, check, fill
from lmpo.teach.factcheck.report import Report, print_table, write_outputs
from lmpo.teach.factcheck.texts import LANGS, ui, verdict_word
from lmpo.teach.names import did_you_mean
from lmpo.teach.refusals import ready_out, refusal

_BY_NAME = {c.name: c for c in [*sampling.CLAIMS, *signal.CLAIMS, *preference.CLAIMS, *kl.CLAIMS, *clipping.CLAIMS,
                                *length.CLAIMS, *hacking.CLAIMS, *breadth.CLAIMS]}
ORDER = ("grpo_no_critic", "zero_var_no_gradient", "dpo_no_rm_no_sampling", "kl_estimators", "one_update_no_clipping",
         "length_bias_aggregation", "reference_no_gradient", "gspo_geometric_mean", "beta_keeps_close",
         "dynamic_sampling_signal", "clip_higher_entropy", "reward_model_hacking", "online_beats_offline_dpo",
         "rloo_leave_one_out", "grpo_std_upweights", "ppo_clip_lower_bound", "dpo_weight_sigmoid", "ipo_target_margin",
         "k3_loss_minimises_kl", "rl_sharpens_not_widens")
CLAIMS: list[Claim] = [_BY_NAME[name] for name in ORDER]
assert set(ORDER) == set(_BY_NAME), "every claim has its place in ORDER"


@dataclass
class FactcheckOptions:
    only: str = ""
    """Comma-separated claim names to run (default: all)."""
    fast: bool = False
    """Run only the exact computations (seconds), not the training experiments."""
    out: str = "factcheck"
    """Directory for factcheck.html, factcheck.json, plots/, runs/ and logs/."""
    threads: int = 2
    """Torch CPU threads for training runs and computations."""
    lang: str = "en"
    """Language of the report: en or zh."""
    seed: int = 0
    """Seed of the SFT start and of every experiment."""


def select(only: str = "", fast: bool = False, lang: str = "en") -> list[Claim]:
    """The claims to run, in the report's order; unknown names are an error (in `lang`) that lists the
    known ones."""
    names = [n.strip() for n in only.split(",") if n.strip()]
    if only.strip() and not names:
        raise ValueError(refusal("factcheck.only_empty", lang, only=only))
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(refusal("factcheck.only_twice", lang, only=only, names=", ".join(twice)))
    unknown = [n for n in names if n not in _BY_NAME]
    if unknown:
        named = ", ".join(f"{n}{did_you_mean(n, ORDER, lang)}" for n in unknown)
        raise ValueError(refusal("factcheck.only_unknown", lang, named=named, names=", ".join(ORDER)))
    chosen = [c for c in CLAIMS if not names or c.name in names]
    return [c for c in chosen if c.fast] if fast else chosen


def skipped_by_fast(only: str, fast: bool) -> list[str]:
    """The claims `--only` names that `--fast` leaves out (training experiments)."""
    names = {n.strip() for n in only.split(",") if n.strip()}
    return [c.name for c in CLAIMS if fast and c.name in names and not c.fast]


def run_factcheck(options: FactcheckOptions, on_outcome: Callable[[int, int, Outcome], None] | None = None,
                  show: bool = False) -> Report:
    """Run the selected claims, write DIR/factcheck.json and DIR/factcheck.html, and return the report;
    `on_outcome(i, n, outcome)` is called as each claim finishes; `show` prints the table."""
    if options.lang not in LANGS:
        raise ValueError(f"--lang {options.lang!r}: choose one of {', '.join(LANGS)}")
    if options.threads < 0:
        raise ValueError(refusal("factcheck.threads", options.lang, threads=options.threads))
    claims = select(options.only, options.fast, options.lang)
    skipped = skipped_by_fast(options.only, options.fast)
    if not claims:
        raise ValueError(refusal("factcheck.fast_none", options.lang, names=", ".join(skipped)))
    import torch

    from lmpo.trainers.runtime import setup_torch

    out = prepare_out(Path(options.out), options.lang)
    if skipped:
        print(fill(ui(options.lang)["skipped_fast"], {"names": ", ".join(skipped)}), file=sys.stderr, flush=True)
    threads_before = torch.get_num_threads()
    try:
        setup_torch(options.threads, options.seed)
        ctx = Context(out=out, threads=options.threads or torch.get_num_threads(), seed=options.seed)
        started = time.perf_counter()
        start_seconds = _sft_start(ctx, options.lang) if any(not c.fast for c in claims) else 0.0
        outcomes = []
        for i, claim in enumerate(claims, 1):
            outcomes.append(check(claim, ctx))
            if on_outcome:
                on_outcome(i, len(claims), outcomes[-1])
    finally:
        torch.set_num_threads(threads_before)
    report = Report(outcomes, time.perf_counter() - started, start_seconds, options.lang, ctx.threads, options.fast)
    write_outputs(report, out)
    if show:
        print_table(report)
    return report


OWNED = ("runs", "plots", "logs")
"""What a factcheck writes beside factcheck.json/html, replaced by the next one in the same --out."""


def prepare_out(out: Path, lang: str = "en") -> Path:
    """`out`, made, and cleared of an earlier factcheck's runs, plots and logs (they must not mix
    into this one's), before any claim runs. A directory whose runs/, plots/ or logs/ no factcheck
    wrote (no factcheck.json beside them: `lmpo compare`'s runs/compare, the user's plots) is
    refused rather than deleted; so is an --out that cannot be a directory."""
    found = [name for name in OWNED if (out / name).exists()]
    if found and not (out / "factcheck.json").is_file():
        raise ValueError(refusal("factcheck.foreign_out", lang, out=out, found=", ".join(f"{name}/" for name in found)))
    ready_out(out, lang)
    for name in found:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    return out


def _sft_start(ctx: Context, lang: str = "en") -> float:
    """Seconds spent obtaining the SFT start: about 0 when cached, else CPT → SFT (once)."""
    from lmpo.teach.start import default_cache, is_cached

    tick = time.perf_counter()
    if not is_cached(ctx.task, ctx.seed, ctx.model):
        print(fill(ui(lang)["sft_start"], {"seed": ctx.seed, "cache": default_cache()}), file=sys.stderr, flush=True)
    with ctx.quiet("sft_start"):
        ctx.start()
    return time.perf_counter() - tick


def progress_line(i: int, n: int, outcome: Outcome, lang: str = "en") -> None:
    """Print claim `i` of `n`'s verdict to stderr, in `lang` (as the table and report)."""
    error = f" ({outcome.error})" if outcome.error else ""
    print(fill(ui(lang)["progress"], {"i": i, "n": n, "name": outcome.claim.name, "error": error,
                                      "verdict": verdict_word(outcome.verdict, lang), "seconds": outcome.seconds}),
          file=sys.stderr, flush=True)


__all__ = ["CLAIMS", "DEPENDS", "ERROR", "FAILS", "HOLDS", "FactcheckOptions", "Report", "progress_line",
           "run_factcheck", "select"]
