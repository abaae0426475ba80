"""Flags that existed and were documented nowhere: each is named in its command's documentation,
and still exists in the command's --help (so the mention stays true)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lmpo.cli.main import make_parser

ROOT = Path(__file__).resolve().parents[1]

DOCUMENTED = [
    (["compare"], "docs/compare.md", ["--config", "--device", "--model", "--precision"]),
    (["exercise", "check"], "docs/exercises.md", ["--name"]),
    (["exercise", "train"], "docs/exercises.md", ["--name", "--eval_problems"]),
    (["eval"], "README.md", ["--batch_size", "--top_k", "--top_p", "--max_parse_errors"]),
    (["factcheck"], "docs/factcheck.md", ["--seed"]),
    (["explain"], "README.md", ["--out", "--list", "--all"]),
]


@pytest.mark.parametrize(("command", "doc", "flags"), DOCUMENTED, ids=[" ".join(c) for c, _, _ in DOCUMENTED])
def test_flag_is_documented_and_exists(command, doc, flags, capsys):
    with pytest.raises(SystemExit):
        make_parser(command[0]).parse_args([*command, "--help"])
    offered = set(re.findall(r"--[a-z_]+", capsys.readouterr().out))
    text = (ROOT / doc).read_text()
    if doc == "README.md":  # it documents every command: the flag on a line of this one
        text = "\n".join(line for line in text.splitlines() if f"lmpo {command[0]}" in line)
    for flag in flags:
        assert flag in offered, f"lmpo {' '.join(command)} has no {flag}"
        assert re.search(rf"(?<![\w-]){flag}\b", text), f"{doc} does not name {flag}"
