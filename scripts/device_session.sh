#!/bin/bash
# Paper-preset cells on a bare, offline GPU machine (the lent device of docs/results.md, "Paper preset on a
# lent H100"): install carried wheels and this checkout, then run the cells in order until BUDGET seconds are
# used, and pack the results (and the small stages, for the next call) into $OUT.
#
# Needs, in the ignored folder .gpu/ of the checkout: whl/ (dp-accounting, dm-tree, opacus, typer and its
# dependencies as wheels for the machine's Python), data/MNIST/raw and data/FashionMNIST/raw (the .gz files),
# commit (the output of `git describe --always --dirty` here: the copy there has no .git), optionally
# stages/ (cached stages from an earlier call). See docs/developing.md.
# usage: bash scripts/device_session.sh BUDGET_SECONDS CELL... (a cell named `probe` times the teacher trainers)
T0=$(date +%s); BUDGET=$1; shift
nvidia-smi -L; python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
source scripts/device_lib.sh
device_setup || exit 1
STAGES=$(python3 -c "from privdistill.engine.cache import default_cache_root as r; print(r())") || exit 1
if [ -d .gpu/stages ]; then mkdir -p "$STAGES" && cp -r .gpu/stages/* "$STAGES/"; fi
python3 -m pytest -q -p no:cacheprovider tests/test_privacy_mechanisms.py tests/test_dpsgd.py -k cuda 2>&1 | tail -2
echo "setup $(( $(date +%s) - T0 ))s"
for c in "$@"; do
  left=$(( BUDGET - ($(date +%s) - T0) ))
  if [ $left -lt 20 ]; then echo "=== no time left for $c"; continue; fi
  echo "=== $c (budget left ${left}s) $(date +%T)"
  if [ "$c" = probe ]; then
    for chunk in 250 50; do  # vectorised in one chunk and in the paper preset's chunks of 50, then the loop
      timeout -k 5 $(( left < 150 ? left : 150 )) privdistill bench teachers -d mnist -n 250 --steps 40 \
        --trainers vectorized --chunk-size $chunk --device cuda -o "$OUT/teachers-chunk$chunk.json"
    done
    timeout -k 5 60 privdistill bench teachers -d mnist -n 5 --steps 40 --trainers loop --device cuda \
      -o "$OUT/teachers-loop.json"
    continue
  fi
  timeout -k 5 $left privdistill bench run --preset paper --no-audit --no-report --no-lock --only "=$c" > "/tmp/bench-$c.log" 2>&1
  rc=$?
  echo "rc $rc after $(( $(date +%s) - T0 ))s"
  [ $rc -ne 0 ] && tail -5 "/tmp/bench-$c.log"
  grep -h -E "accuracy|epsilon|ε|Error|error|wall" "runs/bench-paper/$c.log" 2>/dev/null | tail -12
done
# Results and run directories without weights or ledger arrays (the summaries are what is recorded). Pack
# them every call: results/paper/ is not ignored, so the next call's copy of this checkout replaces it.
tar czf "$OUT/paper.tgz" --exclude='*.safetensors' --exclude='*.pt' --exclude='*.npy' results/paper runs/bench-paper 2>/dev/null
cd "$STAGES" 2>/dev/null || exit 0
small=$(ls -d baseline-* generator-* vae-* 2>/dev/null)
[ -n "$small" ] && tar czf "$OUT/stages.tgz" $small
ls */stage.json >/dev/null 2>&1 && tar czf "$OUT/stagemeta.tgz" */stage.json $(ls */metrics.jsonl 2>/dev/null)
grep -h -E '"stage"|build_seconds' */stage.json 2>/dev/null
exit 0
