"""The layering in .importlinter holds, and the same contracts catch a forbidden import.

The contracts run with import-linter (a maintained tool, not a hand-written walker) over
the source checkout. The fixture half copies the package to a scratch folder, plants one
forbidden import per case and expects exactly that contract to break: a contract file that
silently stopped matching (a renamed package, a typo) would otherwise pass for ever.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / ".importlinter"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(root: Path, contract: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    only = ["--contract", contract] if contract else []
    return subprocess.run([str(LINT_IMPORTS), "--config", str(CONFIG), "--no-cache", *only],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)


def test_package_keeps_every_contract():
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_contract_file_has_no_escape_hatches():
    lines = [line for line in CONFIG.read_text().splitlines() if not line.startswith(";")]
    text = "\n".join(lines)
    assert "ignore_imports" not in text
    assert text.count("[importlinter:contract:") >= 5


def test_no_dynamic_imports_of_project_modules():
    """importlib/__import__ on a project module would hide an edge from the contracts."""
    offenders = []
    for path in sorted((REPO / "thinkmem_ros").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__"):
                arg = ast.unparse(node.args[0]) if node.args else ""
                if "thinkmem_ros" in arg:
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno} {arg}")
    assert not offenders, offenders


# (module to plant the import in, the import, the contract that must break)
VIOLATIONS = [
    ("policy/situation.py", "import torch", "robot-side"),
    ("robot/hotswap.py", "from thinkmem_ros.consolidator import store", "robot-side"),
    ("policy/runtime.py", "from thinkmem_ros.policy.training import train", "robot-side"),
    ("link/spool.py", "from thinkmem_ros.robot import situation", "link"),
    ("consolidator/knowledge.py", "import rclpy", "consolidator"),
    ("consolidator/gate.py", "from thinkmem_ros.robot import hotswap", "consolidator"),
    ("core/metrics.py", "from thinkmem_ros.commands import train", "layers"),
    ("robot/node_config.py", "from thinkmem_ros.playback import bag_files", "layers"),
    ("consolidator/material.py", "from thinkmem_ros.consolidator import gate", "acyclic"),
]


@pytest.fixture(scope="module")
def package_copy(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("layering")
    shutil.copytree(REPO / "thinkmem_ros", root / "thinkmem_ros",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return root


@pytest.mark.parametrize(("module", "statement", "contract"), VIOLATIONS,
                         ids=[v[0] for v in VIOLATIONS])
def test_a_planted_violation_breaks_its_contract(package_copy, module, statement, contract):
    target = package_copy / "thinkmem_ros" / module
    original = target.read_text()
    try:
        target.write_text(original + f"\n{statement}  # planted by test_architecture\n")
        result = lint_imports(package_copy, contract)
    finally:
        target.write_text(original)
    assert result.returncode != 0, result.stdout
    assert "BROKEN" in result.stdout and "0 broken" not in result.stdout, result.stdout
