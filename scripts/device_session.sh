#!/bin/bash
# Paper-preset cells on a bare, offline GPU machine (the lent device of docs/results.md, "Paper preset on a
# lent H100"): install carried wheels and this checkout, then run the cells in order until BUDGET seconds are
# used, and pack the results (and the small stages, for the next call) into $OUT.
#
# Needs, in the ignored folder .gpu/ of the checkout: whl/ (dp-accounting, dm-tree, opacus, typer and its
# dependencies as wheels for the machine's Python), data/MNIST/raw and data/FashionMNIST/raw (the .gz files),
# optionally stages/ (cached stages from an earlier call).
# usage: bash scripts/device_session.sh BUDGET_SECONDS CELL... (a cell named `probe` runs teacher_chunk_probe.py)
T0=$(date +%s); BUDGET=$1; shift
nvidia-smi -L; python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PRIVDISTILL_SOURCES=$PWD/.gpu/data PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile . 2>&1 | grep -v WARN
if [ -d .gpu/stages ]; then mkdir -p ~/.cache/privdistill/stages && cp -r .gpu/stages/* ~/.cache/privdistill/stages/; fi
python3 -m pytest -q -p no:cacheprovider tests/test_privacy_mechanisms.py -k cuda 2>&1 | tail -2
echo "setup $(( $(date +%s) - T0 ))s"
for c in "$@"; do
  left=$(( BUDGET - ($(date +%s) - T0) ))
  if [ $left -lt 20 ]; then echo "=== no time left for $c"; continue; fi
  echo "=== $c (budget left ${left}s) $(date +%T)"
  if [ "$c" = probe ]; then
    timeout -k 5 $(( left < 150 ? left : 150 )) python3 scripts/teacher_chunk_probe.py 2>&1 | grep -v Warn
    continue
  fi
  timeout -k 5 $left privdistill bench run --preset paper --no-audit --no-report --no-lock --only "=$c" > "/tmp/bench-$c.log" 2>&1
  echo "rc $? after $(( $(date +%s) - T0 ))s"
  grep -h -E "accuracy|epsilon|ε|Error|error|wall" "runs/bench-paper/$c.log" 2>/dev/null | tail -12
done
tar czf "$OUT/paper.tgz" results/paper runs/bench-paper 2>/dev/null
cd ~/.cache/privdistill/stages || exit 0
tar czf "$OUT/stages.tgz" $(ls -d baseline-* generator-* vae-* 2>/dev/null)
tar czf "$OUT/stagemeta.tgz" $(ls */stage.json */metrics.jsonl 2>/dev/null)
grep -h -E '"stage"|build_seconds' */stage.json
