"""Assembling an explanation: prose from the language table, numbers from `lmpo.algos`.

A builder makes a `Page`, adds steps whose values are tensors the library computed, and calls
`finish`. Prose is looked up by key in `text_en` / `text_zh` and filled with the settings, so no
number in it is typed by hand either.
"""

from __future__ import annotations

import re

from lmpo.teach.explain import text_en, text_zh
from lmpo.teach.explain.model import Diagram, Explanation, Step, Value, cells, labels

LANGUAGES = {"en": text_en, "zh": text_zh}


class Texts:
    """The prose of one language: `texts(key, **fields)` is the entry filled with the fields."""

    def __init__(self, lang: str) -> None:
        if lang not in LANGUAGES:
            raise ValueError(f"unknown language {lang!r}; choose one of: {', '.join(LANGUAGES)}")
        self.lang = lang
        self.table: dict[str, str] = LANGUAGES[lang].TEXT

    def __call__(self, key: str, **fields: object) -> str:
        try:
            entry = self.table[key]
        except KeyError:
            raise KeyError(f"no {self.lang} text for {key!r} (lmpo/teach/explain/text_{self.lang}.py)") from None
        return entry.format(**fields) if fields else entry


def annotate_terms(texts: list[str], glossary: dict[str, str]) -> list[str]:
    """Give each glossary term in both languages once, at its first use across `texts` (in order):
    `优势` becomes `优势（advantage）` the first time it appears, and stays bare afterwards. An
    occurrence inside a longer glossary term (`优势` in `广义优势估计`) does not count as a use."""
    seen: set[str] = set()
    out = []
    for text in texts:
        for term in sorted(glossary, key=len, reverse=True):
            if term in seen:
                continue
            at = _first_free(text, term, [t for t in glossary if len(t) > len(term) and term in t])
            if at < 0:
                continue
            seen.add(term)
            end = at + len(term)
            text = f"{text[:end]}（{glossary[term]}）{text[end:]}"
        out.append(text)
    return out


def _first_free(text: str, term: str, longer: list[str]) -> int:
    """Index of the first occurrence of `term` that is not part of an occurrence of a longer term,
    nor followed by a parenthesis already (which would make two in a row)."""
    covered = [(i, i + len(t)) for t in longer for i in _positions(text, t)]
    for i in _positions(text, term):
        followed = text[i + len(term):i + len(term) + 1] in ("（", "(")
        if not followed and not any(a <= i and i + len(term) <= b for a, b in covered):
            return i
    return -1


def _positions(text: str, term: str) -> list[int]:
    found, i = [], text.find(term)
    while i >= 0:
        found.append(i)
        i = text.find(term, i + 1)
    return found


class Page:
    """Collects the steps of one method's worked example."""

    def __init__(self, method: str, lang: str) -> None:
        self.method = method
        self.tx = Texts(lang)
        self.steps: list[Step] = []
        self.diagrams: list[Diagram] = []

    def value(self, name: str, symbol: str, tensor, *, given: bool = False, source: str = "",
              mask=None, per: str = "token") -> Value:
        """A value of the example. `per`: `token` (rows y1.., columns t1..), `sequence` (one row,
        columns y1..), `pair` (one row, columns pair1..), `scalar`, or `entry` (one row, 1..N)."""
        rows = cells(tensor, mask)
        width = max(len(r) for r in rows)
        columns: tuple[str, ...] = ()
        row_labels: tuple[str, ...] = ()
        if per == "token":
            columns, row_labels = labels(width, "t"), labels(len(rows), "y")
        elif per == "sequence":
            columns = labels(width, "y")
        elif per == "pair":
            columns = labels(width, self.tx("word.pair") + " ")
        elif per == "entry":
            columns = tuple(str(j + 1) for j in range(width))
        return Value(name, symbol, self.tx(f"value.{name}"), rows, given, source, columns, row_labels)

    def step(self, key: str, formula: str, values: list[Value], **fields: object) -> None:
        self.steps.append(Step(key, self.tx(f"step.{key}.title", **fields), formula, tuple(values),
                               self.tx(f"step.{key}.text", **fields)))

    def diagram(self, key: str, draw, **fields: object) -> None:
        self.diagrams.append(Diagram(key, self.tx(f"diagram.{key}", **fields), draw))

    def finish(self, *, formula: str, papers: tuple[str, ...], commands: tuple[str, ...], settings: dict,
               **fields: object) -> Explanation:
        m = self.method
        title, summary, when = (self.tx(f"{m}.{part}", **fields) for part in ("title", "summary", "when"))
        # the order the pages show them in, so that a term is explained where it is first read
        prose = [summary, when] + [t for s in self.steps for t in (s.title, s.text)]
        prose += [d.caption for d in self.diagrams]
        prose = annotate_terms(prose, getattr(LANGUAGES[self.tx.lang], "GLOSSARY", {}))
        summary, when = prose[:2]
        steps = [Step(s.key, prose[2 + 2 * i], s.formula, s.values, prose[3 + 2 * i]) for i, s in enumerate(self.steps)]
        captions = prose[2 + 2 * len(self.steps):]
        diagrams = tuple(Diagram(d.key, c, d.draw) for d, c in zip(self.diagrams, captions))
        papers = tuple(re.sub(r"\{(paper\.\w+)\}", lambda note: self.tx(note.group(1)), p) for p in papers)
        return Explanation(m, self.tx.lang, title, summary, formula, papers, commands, settings, when,
                           tuple(steps), diagrams)
