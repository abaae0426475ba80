"""A file-system error that reaches `lmpo`'s one-line handler says what failed: an unreadable data
file was said as `cannot write DATA: permission denied`."""

from __future__ import annotations

import errno
import pathlib

import pytest

from lmpo.cli.main import main

ORIGINAL_OPEN = pathlib.Path.open


def _refuse(path: pathlib.Path):
    """Path.open as it behaves for a file its user may not read (the tests run as root, who may)."""

    def open(self, mode="r", *args, **kwargs):  # noqa: A001 -- Path.open's own name and mode
        if self == path:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return ORIGINAL_OPEN(self, mode, *args, **kwargs)

    return open


def test_an_unreadable_data_file_is_said_as_a_read(tmp_path, monkeypatch, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "12", "completion": "12"}\n')
    monkeypatch.setattr(pathlib.Path, "open", _refuse(data))
    assert main(["data", str(data), "--task", "sort_digits"]) == 1
    assert capsys.readouterr().err.strip() == f"lmpo: error: cannot read {data}: permission denied"


@pytest.mark.parametrize(("call", "action"), [
    (lambda p: p.read_text(), "read"),
    (lambda p: p.open("rb"), "read"),
    (lambda p: open(p), "read"),
    (lambda p: p.write_text("x"), "write"),
    (lambda p: open(p, "a"), "write"),
    (lambda p: (p / "sub").mkdir(), "create"),
])
def test_the_action_comes_from_the_failed_call(call, action, tmp_path):
    from lmpo.cli.errors import failed_action

    with pytest.raises(OSError) as caught:
        call(tmp_path / "missing" / "file")
    assert failed_action(caught.value) == action
