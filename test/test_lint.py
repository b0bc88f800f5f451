"""Style is a test: ruff (pyflakes, pycodestyle, isort, pep257 subset) over package and tests."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_ruff_is_clean():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed (requirements/test.txt installs it)")
    out = subprocess.run([ruff, "check", "--output-format", "concise", "thinkmem_ros", "test",
                          "launch"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
