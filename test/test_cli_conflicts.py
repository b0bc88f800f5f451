"""Options that conflict, or that a command would silently ignore, are refused in one line.

Each case returns in well under a few seconds: the refusal comes before any work starts.
"""

from __future__ import annotations

import functools
import importlib

import pytest
from cli_checks import assert_one_line, run

# ------------------------------------------------------------------ bench


@pytest.mark.parametrize("argv, says", [
    (["exp2", "--bundle", "models/default"], "exp2 does not take --bundle"),
    (["latency", "--preset", "streaming"], "latency does not take --preset"),
], ids=["exp2-bundle", "latency-preset"])
def test_bench_option_the_benchmark_does_not_take_is_an_error_line(capsys, monkeypatch,
                                                                     argv, says):
    """The line read ``thinkmem bench exp2 does not take --bundle``, without ``error:``."""
    module = importlib.import_module(f"thinkmem_ros.bench.{argv[0]}")

    @functools.wraps(module.run)  # its signature, which decides what it takes, is kept
    def never(**_):
        raise AssertionError("the benchmark started")

    monkeypatch.setattr(module, "run", never)
    code, err = run(capsys, "bench", *argv)
    assert_one_line(code, err, says)
    assert err.startswith("thinkmem bench: error: "), err


# ------------------------------------------------------------------ knowledge


@pytest.mark.parametrize("make", [None, "folder", "not-a-database"])
def test_knowledge_list_names_a_path_with_a_newline_on_one_line(tmp_path, capsys, make):
    """The path was printed as given, so a newline in it split the error over two lines."""
    db = tmp_path / "a\nb.db"
    if make == "folder":
        db.mkdir()
    elif make == "not-a-database":
        db.write_bytes(b"not sqlite at all, " * 10)
    code, err = run(capsys, "knowledge", "list", "--db", db)
    assert_one_line(code, err, "thinkmem knowledge: error:", "a b.db")
    assert code == 2, err
