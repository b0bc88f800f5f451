"""Benchmark modules run by hand (``python -m thinkmem_ros.bench.X``) refuse bad input in
one line with exit 2, as the ``thinkmem`` verbs do, instead of a traceback or a run."""

from __future__ import annotations

import pytest

from thinkmem_ros.bench import anticipation, bare_node


def _refused(capsys, main, argv) -> str:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("argv, says", [
    (["--seeds", "-3"], "--seeds must be in [1, 1000]"),
    (["--quick", "--policy-bundle", "/nonexistent/bundle"], "bundle folder not found"),
], ids=["negative-seeds", "missing-bundle"])
def test_anticipation_refuses(capsys, argv, says):
    assert says in _refused(capsys, anticipation.main, argv)


def test_anticipation_refuses_its_outputs_before_the_run(capsys, tmp_path, monkeypatch):
    """--json and --plot were written after the run, over whatever was there: a text file
    of the user's became a report, and a format matplotlib cannot save was a traceback."""
    monkeypatch.setattr(anticipation, "run", lambda *_a, **_k: pytest.fail("the run started"))
    victim = tmp_path / "notes.txt"
    victim.write_text("mine\n")
    assert "--json" in _refused(capsys, anticipation.main, ["--quick", "--json", str(victim)])
    assert "PNG" in _refused(capsys, anticipation.main, ["--quick", "--plot",
                                                         str(tmp_path / "a.yaml")])
    assert victim.read_text() == "mine\n"


@pytest.mark.parametrize("argv, says", [
    (["--signals", ""], "not signals of the default map"),
    (["--signals", "temperature,nope"], "['nope']"),
    (["--signals", "temperature", "--executor", "fast"], "invalid choice: 'fast'"),
], ids=["empty", "unknown-signal", "unknown-executor"])
def test_bare_node_refuses_before_starting_ros(capsys, argv, says):
    assert says in _refused(capsys, bare_node.main, argv)
