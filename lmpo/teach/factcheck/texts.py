"""The words of the report in each language: English from the claims themselves, Chinese from
the table in `zh.py` (same claim names, same template keys and fields)."""

from __future__ import annotations

from lmpo.teach.factcheck.core import DEPENDS, ERROR, FAILS, HOLDS, Claim

LANGS = ("en", "zh")

UI_EN = {
    "title": "lmpo factcheck: claims the field repeats, measured",
    "intro": "{claims}, each measured by a small experiment or an exact computation with lmpo's own functions "
             "and trainers; each verdict follows from the numbers by the criterion stated. {seconds:.0f} s, "
             "torch threads: {threads}.",
    "table_title": "lmpo factcheck — {claims}, {seconds:.0f} s, torch threads: {threads}",
    "claims_one": "1 claim", "claims_many": "{n} claims",
    "claim": "claim", "verdict": "verdict", "seconds": "s", "criterion": "Criterion:", "source": "Source:",
    "key_numbers": "key numbers", "key_numbers_label": "Key numbers:", "evidence": "All measured values",
    "measure": "measure", "value": "value",
    "fast": "exact computation", "slow": "training experiment",
    "progress": "[factcheck] {i}/{n} {name}: {verdict}{error}, {seconds:.1f} s",
    "sft_start": "[factcheck] training the SFT start for seed {seed} once (CPT → SFT, about 70 s on a quiet "
                 "2-core CPU; kept in {cache})",
    "skipped_fast": "[factcheck] skipped {names}: training experiments, which --fast leaves out",
    "start_trained": "(the SFT start was trained first: {seconds:.0f} s of the total; it is cached now)",
    "outputs": "report: {html}  data: {json}",
}
VERDICTS_EN = {HOLDS: "holds", FAILS: "does not hold", DEPENDS: "depends", ERROR: "error"}


def _check(lang: str) -> None:
    if lang not in LANGS:
        raise ValueError(f"--lang {lang!r}: choose one of {', '.join(LANGS)}")


def ui(lang: str) -> dict[str, str]:
    _check(lang)
    if lang == "zh":
        from lmpo.teach.factcheck.zh import UI_ZH

        return UI_ZH
    return UI_EN


def verdict_word(verdict: str, lang: str) -> str:
    _check(lang)
    if lang == "zh":
        from lmpo.teach.factcheck.zh import VERDICTS_ZH

        return VERDICTS_ZH[verdict]
    return VERDICTS_EN[verdict]


def claim_texts(claim: Claim, lang: str) -> dict:
    """{"text", "criterion", "summary", "notes"} of `claim` in `lang`."""
    _check(lang)
    if lang == "zh":
        from lmpo.teach.factcheck.zh import CLAIMS_ZH

        return CLAIMS_ZH[claim.name]
    return {"text": claim.text, "criterion": claim.criterion, "summary": claim.summary, "notes": claim.notes}
