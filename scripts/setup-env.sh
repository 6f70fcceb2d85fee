#!/usr/bin/env bash
# Create .venv with privdistill and its dependencies (idempotent). Used by quickstart.sh and run-tests.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
  echo "privdistill needs Python >= 3.10 (found: $("$PYTHON" --version 2>&1 || echo none))." >&2
  exit 1
fi

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else return 1; fi; }

if [ ! -x .venv/bin/python ]; then
  if ! "$PYTHON" -m venv .venv 2>/dev/null; then
    rm -rf .venv
    echo "python3 -m venv is missing; installing python3-venv with apt-get ..." >&2
    as_root apt-get update -qq && as_root apt-get install -y -qq python3-venv python3-pip >/dev/null \
      || { echo "Install python3-venv (sudo apt-get install python3-venv) and run this again." >&2; exit 1; }
    "$PYTHON" -m venv .venv
  fi
fi

stamp=.venv/.privdistill-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # torch/torchvision first and pinned to the releases this project is tested with; where a pip constraint
  # file caps them (this workplace serves torch 2.14.1 from local disk), pip picks the local wheels.
  if ! .venv/bin/python -c 'import torch, torchvision' 2>/dev/null; then
    .venv/bin/python -m pip install -q "torch==2.14.1" "torchvision==0.29.1" \
      || .venv/bin/python -m pip install -q torch torchvision
  fi
  .venv/bin/python -m pip install -q -e ".[test,dpsgd,ray]"
  touch "$stamp"
fi

# Fashion-MNIST from Debian's package when we may use apt (non-fatal: MNIST alone is enough to start).
if [ ! -d /usr/share/datasets/fashion-mnist ] && command -v apt-get >/dev/null; then
  as_root apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1 || true
fi
