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
    done = subprocess.run([ruff, "check", "--no-cache", "src", "tests", "scripts"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
