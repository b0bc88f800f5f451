"""A refused ``thinkmem consolidator`` start says why in one line and leaves nothing behind.

The project rule: bad input prints one line naming the option, exits 2 and changes
nothing. Each case here broke it once: a refused start left an empty ``history/`` in
the publish folder, a receiver logged that it was bound before refusing its store, and a
publish folder that is a file came out as a bare ``[Errno 20]`` naming no option.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from test_consolidator_cli_hostile import assert_one_line

from thinkmem_ros.commands import consolidator
from thinkmem_ros.consolidator.round_lock import RoundLock, RoundLockError
from thinkmem_ros.consolidator.store import ExperienceStore
from thinkmem_ros.core.arguments import OneLineParser
from thinkmem_ros.link.security import write_signing_keypair

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")


@pytest.fixture
def sign(tmp_path) -> Path:
    """The consolidator's signing key (as ``thinkmem keys --name consolidator`` writes it)."""
    return write_signing_keypair(tmp_path / "keys", "consolidator")[1]


def run_cli(capsys, *argv) -> tuple[int, str]:
    """Exit status and stderr of ``thinkmem consolidator ARGV`` run in this process.

    The signal handlers a started service installs are put back, so pytest's stay.
    """
    parser = OneLineParser(prog="thinkmem consolidator")
    consolidator.add_arguments(parser)
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = consolidator.main(parser.parse_args([str(a) for a in argv]))
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    return code, capsys.readouterr().err




def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


SERVE = ("--bind", "tcp://127.0.0.1:*", "--curve", "off")


@pytest.mark.parametrize("argv, says", [
    (["--db", "c2.db", "--once"], "--db"),
    (["--db", "c.db", "--rehearsal-npz", "garbage.npz", *SERVE], "garbage.npz"),
    (["--db", "c.db", "--rehearsal-npz", "garbage.npz", "--canary-fraction", "0.5", *SERVE],
     "garbage.npz"),
], ids=["once-no-store", "serve-bad-npz", "canary-bad-npz"])
def test_a_refused_start_creates_nothing(tmp_path, sign, capsys, monkeypatch, argv, says):
    """It left the publish folder with an empty history/ (made before the checks ran)."""
    monkeypatch.chdir(tmp_path)
    ExperienceStore(tmp_path / "c.db").close()
    (tmp_path / "garbage.npz").write_bytes(b"not an npz")
    before = tree(tmp_path)
    code, err = run_cli(capsys, *argv, "--publish-dir", "pub2", "--signing-key", sign)
    assert_one_line(code, err, "thinkmem consolidator: error:", says)
    assert tree(tmp_path) == before


@pytest.mark.parametrize("publish_dir, says", [
    ("some_file", "--publish-dir some_file: not a folder"),
    ("some_file/pub", "some_file: not a folder"),
    ("pub", "--publish-dir pub: pub/history is not a folder"),
], ids=["a-file", "inside-a-file", "history-a-file"])
def test_a_publish_dir_that_cannot_be_a_folder_is_refused_by_name(tmp_path, sign, capsys,
                                                                  monkeypatch, publish_dir,
                                                                  says):
    """A file there came out as "[Errno 20] Not a directory: 'some_file/history'"."""
    monkeypatch.chdir(tmp_path)
    ExperienceStore(tmp_path / "c.db").close()
    (tmp_path / "some_file").write_text("mine")
    (tmp_path / "pub").mkdir()
    (tmp_path / "pub" / "history").write_text("mine")
    before = tree(tmp_path)
    code, err = run_cli(capsys, "--db", "c.db", "--publish-dir", publish_dir,
                        "--signing-key", sign, "--once")
    assert_one_line(code, err, "thinkmem consolidator: error:", says)
    assert tree(tmp_path) == before
    assert (tmp_path / "some_file").read_text() == "mine"


@pytest.mark.parametrize("db, says", [
    ("bad/dir", "--db bad/dir: cannot open store: path 'bad/dir' is a folder"),
    ("some_file/c.db", "some_file is not a folder"),
], ids=["a-folder", "inside-a-file"])
def test_receive_refuses_its_store_before_it_binds(tmp_path, db, says):
    """It logged "receiver bound to ..., store bad/dir" and then refused: two lines."""
    (tmp_path / "bad" / "dir").mkdir(parents=True)
    (tmp_path / "some_file").write_text("mine")
    before = tree(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "thinkmem_ros.cli", "consolidator", "receive", "--db", db,
         "--bind", "tcp://127.0.0.1:*", "--curve", "off"],
        capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=60)
    assert_one_line(done.returncode, done.stderr, "thinkmem consolidator receive: error:",
                    says)
    assert "READY" not in done.stdout and tree(tmp_path) == before


def test_serving_names_the_option_of_a_store_it_cannot_open(tmp_path, sign, capsys,
                                                           monkeypatch):
    """It said "cannot open store: path 'bad/dir' is a folder", naming no option."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad" / "dir").mkdir(parents=True)
    code, err = run_cli(capsys, "--db", "bad/dir", "--publish-dir", "pub",
                        "--signing-key", sign, *SERVE)
    assert_one_line(code, err, "thinkmem consolidator: error: --db bad/dir: cannot open")
    assert not (tmp_path / "pub").exists()


def test_a_start_refused_after_the_lock_leaves_no_lock_behind(tmp_path, sign, capsys,
                                                              monkeypatch):
    """An address in use left c3.db.rounds.lock and pub5/.rounds.lock behind."""
    monkeypatch.chdir(tmp_path)
    before = tree(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, err = run_cli(capsys, "--db", "c3.db", "--publish-dir", "pub5", "--signing-key",
                            sign, "--bind", f"tcp://127.0.0.1:{port}", "--curve", "off")
    assert_one_line(code, err, "thinkmem consolidator: error:", f"127.0.0.1:{port}")
    assert tree(tmp_path) == before


def test_a_lock_another_consolidator_holds_leaves_nothing_behind(tmp_path):
    ExperienceStore(tmp_path / "c.db").close()
    before = tree(tmp_path)
    with RoundLock(tmp_path / "c.db", tmp_path / "pub"):
        held = tree(tmp_path)
        with pytest.raises(RoundLockError, match="another consolidator"):
            RoundLock(tmp_path / "c.db", tmp_path / "new" / "pub")
        assert tree(tmp_path) == held
    assert tree(tmp_path) != before  # a lock that was used stays, for the next start


def test_the_lock_of_a_store_in_a_folder_not_made_yet(tmp_path):
    """Serving --db nodir/c.db (the store makes its folder) failed with "[Errno 2] No such
    file or directory: '.../nodir/c.db.rounds.lock'"; a refused start takes the folder back."""
    lock = RoundLock(tmp_path / "nodir" / "c.db", tmp_path / "pub")
    assert (tmp_path / "nodir" / "c.db.rounds.lock").is_file()
    lock.discard()
    assert tree(tmp_path) == []
