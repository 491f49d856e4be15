"""tasks.durable's small helpers: the writability probe, atomic replacement, folder names."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tasks.durable import is_folder_name, replace_atomically, unwritable


def test_a_new_folder_under_a_writable_one_is_writable_and_the_probe_leaves_nothing(tmp_path):
    assert unwritable(tmp_path / "a" / "b") is None
    assert list(tmp_path.iterdir()) == []  # neither the folders nor the probe file were kept


def test_a_file_on_the_path_is_named(tmp_path):
    (tmp_path / "afile").write_text("x")
    assert unwritable(tmp_path / "afile") == f"{tmp_path / 'afile'} is a file"
    assert unwritable(tmp_path / "afile" / "sub") == f"{tmp_path / 'afile'} is a file"


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_a_folder_no_file_can_be_made_in_is_unwritable_even_for_root():
    # os.access says yes to root for /proc; the probe file finds out it is not so.
    said = unwritable(Path("/proc/nope/out"))
    assert said == "/proc is not writable (no files can be made in it)"


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write a read-only folder")
def test_a_read_only_folder_is_unwritable(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        assert unwritable(ro / "out") == f"{ro} is not writable"
    finally:
        ro.chmod(0o700)


def test_replace_atomically_keeps_the_old_file_and_no_temporary_when_the_write_fails(tmp_path):
    target = tmp_path / "t.json"
    target.write_text("old")

    def torn(tmp: Path) -> None:
        tmp.write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        replace_atomically(target, torn)
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]
    replace_atomically(target, lambda tmp: tmp.write_text("new"))
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]


@pytest.mark.parametrize(
    "name, ok",
    [
        ("run-1", True),
        ("a.b", True),
        ("", False),
        ("..", False),
        (".staging", False),
        ("a/b", False),
        ("a\\b", False),
        ("/abs", False),
        ("my run", True),
        (" ", False),
        (" run", False),
        ("a\tb", False),
        ("a\nb", False),
        ("-x", False),
        ("x" * 255, True),
        ("x" * 256, False),
        ("é" * 128, False),  # 256 bytes
    ],
)
def test_folder_names(name, ok):
    assert is_folder_name(name) is ok


def test_parents_made_for_a_path_are_removed_when_nothing_was_put_in_them(tmp_path):
    from tasks.durable import parents_made_for

    with pytest.raises(KeyboardInterrupt), parents_made_for(tmp_path / "a" / "b" / "out"):
        assert (tmp_path / "a" / "b").is_dir()
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []
    with parents_made_for(tmp_path / "a" / "b" / "out"):
        (tmp_path / "a" / "b" / "out").mkdir()
    assert (tmp_path / "a" / "b" / "out").is_dir()  # kept, with its parents
    (tmp_path / "c").mkdir()
    with parents_made_for(tmp_path / "c" / "d" / "out"):
        (tmp_path / "c" / "keep").write_text("x")  # a folder there before is not made for it
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["keep"]
