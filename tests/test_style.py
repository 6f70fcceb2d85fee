"""The tree passes the project's ruff configuration (pyproject.toml: E, F, W, I at 120 columns)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> str | None:
    beside_python = Path(sys.executable).with_name("ruff")
    return str(beside_python) if beside_python.exists() else shutil.which("ruff")


def test_ruff_passes():
    ruff = _ruff()
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]')")
    done = subprocess.run([ruff, "check", "--no-cache", "src", "tests", "scripts", "experiments"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_each_method_file_reads_as_its_algorithm_box():
    """The method contract's size budget: a method file (config, algorithm step, short run) stays within 350
    lines, and no function anywhere in methods/ runs over 80."""
    import ast
    from pathlib import Path

    methods = Path(__file__).parent.parent / "src" / "privdistill" / "methods"
    for path in sorted(methods.glob("*.py")):
        text = path.read_text()
        assert len(text.splitlines()) <= 350, f"{path.name}: {len(text.splitlines())} lines"
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                assert length <= 80, f"{path.name}: {node.name} is {length} lines"
