"""CPT concatenates its documents and cuts them into `--seq_len` rows, so a document's length is
no reason to refuse it: a 3,001-token document stopped `lmpo train cpt --data` under the default
`--max_length 1024`, and the error offered only `--overlong skip` or `truncate`, both of which
drop text. CPT now applies no limit unless given `--max_length N`; SFT keeps its limit, and the
error names a larger `--max_length` where that is the limit."""

from __future__ import annotations

import json

import pytest

from lmpo.cli.main import main
from lmpo.envs.data import DataError, load_sft

from hardening_common import error_line

RUN = ["--model", "tiny", "--threads", "1", "--steps", "1", "--batch_size", "2", "--eval_problems", "0",
       "--save_every", "0"]


def _docs(tmp_path) -> str:
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": " ".join(["1 2 3 4 5"] * 300)}) + "\n" for _ in range(3)))
    return str(path)


def test_cpt_trains_on_documents_of_any_length_by_default(tmp_path, capsys):
    assert main(["train", "cpt", "--data", _docs(tmp_path), "--out", str(tmp_path / "a"), *RUN]) == 0
    out = capsys.readouterr().out
    assert "kept 3; no length limit" in out
    config = json.loads((tmp_path / "a" / "result.json").read_text())["config"]
    assert config["max_length"] == 0


def test_cpt_caps_documents_only_where_asked(tmp_path, capsys):
    data = _docs(tmp_path)
    assert main(["train", "cpt", "--data", data, "--out", str(tmp_path / "b"), "--overlong", "skip", *RUN]) == 2
    assert "overlong=skip acts on documents over --max_length, and CPT has none by default" in error_line(capsys)
    assert main(["train", "cpt", "--data", data, "--out", str(tmp_path / "c"), "--max_length", "2000", *RUN]) == 2
    assert error_line(capsys).endswith("row 1: field 'text': 3000 tokens, over max_length 2000 (pass a larger "
                                       "--max_length, or --overlong skip or --overlong truncate, to load such rows)")
    assert main(["train", "cpt", "--data", data, "--out", str(tmp_path / "d"), "--max_length", "1000",
                 "--overlong", "truncate", *RUN]) == 0
    assert "over max_length 1000 (truncate): 0 skipped, 3 truncated" in capsys.readouterr().out


def test_sft_keeps_its_limit_and_names_a_larger_max_length(tmp_path, char_tokenizer):
    path = tmp_path / "sft.jsonl"
    path.write_text(json.dumps({"prompt": "1" * 40, "completion": "2"}) + "\n")
    with pytest.raises(DataError, match=r"over max_length 16 \(pass a larger --max_length, or --overlong skip"):
        load_sft(path, char_tokenizer, max_length=16)
    with pytest.raises(DataError, match=r"over the model's context of 16 tokens \(pass --overlong skip"):
        load_sft(path, char_tokenizer, max_length=16, limit_name="the model's context of 16 tokens")
