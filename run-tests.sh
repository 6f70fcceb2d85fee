#!/usr/bin/env bash
# Run the test suite (sets up .venv first if needed). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup-env.sh
# One pytest worker per CPU (each test runs torch single-threaded, tests/conftest.py), a test file per worker so
# that a file's module-scoped fixtures (a Ray instance, trained models) are built once: about half the serial
# wall time on 2 cores. PYTEST_XDIST_AUTO_NUM_WORKERS=N sets the count; `-n 0` after the script runs serially.
# pytest exits 5 when it collects no tests: with `set -e` that fails this script, as it should.
exec .venv/bin/python -m pytest -q -n logical --dist loadfile "$@"
