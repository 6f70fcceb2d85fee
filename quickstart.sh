#!/usr/bin/env bash
# Set everything up and run the main job on an embedded default: installs privdistill into .venv, gets MNIST
# (offline copy if one is known, else download), trains and evaluates on the CPU, prints the result.
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup-env.sh

# Offline copies of the official files, if this machine has them (searched before any download).
for dir in ../shared/data/MNIST/raw /usr/share/datasets/mnist; do
  [ -d "$dir" ] && export PRIVDISTILL_SOURCES="${PRIVDISTILL_SOURCES:+$PRIVDISTILL_SOURCES:}$(cd "$dir" && pwd)"
done
.venv/bin/privdistill data prepare mnist
.venv/bin/privdistill train baseline --dataset mnist --preset quick "$@"
