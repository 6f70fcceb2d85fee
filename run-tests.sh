#!/usr/bin/env bash
# Run the test suite (sets up .venv first if needed). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup-env.sh
# pytest exits 5 when it collects no tests: with `set -e` that fails this script, as it should.
exec .venv/bin/python -m pytest -q "$@"
