#!/bin/bash
# Second lent-GPU call of 2026-11-26: DPDFD on Fashion-MNIST through the teacher-fitted generator
# (`--config teacher-generator`, quick preset, paper accounting) at the norm bound C = 1e-4 (the paper's ImageNet
# value): whole-pipeline seeds 1 and 2 at ε = 10 (seed 0 ran in the first call), seed 0 at ε = 1, and the preset's
# C on seed 0's stages at both ε. Installs what
# device_session.sh installs, then packs each finished run into $OUT/probe2.tgz as it goes.
# usage: bash scripts/device_probe_dpdfd.sh DEADLINE_SECONDS
T0=$(date +%s); DEADLINE=${1:-200}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PRIVDISTILL_SOURCES=$PWD/.gpu/data PYTHONUNBUFFERED=1
export PRIVDISTILL_GIT_COMMIT=$(cat .gpu/commit 2>/dev/null) PRIVDISTILL_CACHE=$PWD/runs/stage-cache
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile . || exit 1
echo "setup $(( $(date +%s) - T0 ))s"; mkdir -p runs/probe2
DPDFD=(dpdfd -d fashion-mnist --accounting paper --preset quick --config teacher-generator)
probe() {  # probe NAME ARGS...
  local name=$1 left; shift; left=$(( DEADLINE - ($(date +%s) - T0) ))
  if [ $left -lt 25 ]; then echo "=== no time left for $name"; return; fi
  echo "=== $name (left ${left}s)"
  timeout -k 5 $left privdistill "${DPDFD[@]}" "$@" --device cuda --no-progress --run-dir "runs/probe2/$name" \
    > "runs/probe2/$name.log" 2>&1
  echo "rc $? after $(( $(date +%s) - T0 ))s"; grep -E "test_accuracy|epsilon_" "runs/probe2/$name.log" | head -3
  tar czf "$OUT/probe2.tgz" --exclude='*.safetensors' --exclude='*.pt' --exclude='*.npy' --exclude=synthetic runs/probe2
}
probe eps10-c1e-4-seed1 --epsilon 10 --max-steps 2000 --set dpdfd.clip_norm=0.0001 --seed 1
probe eps10-c1e-4-seed2 --epsilon 10 --max-steps 2000 --set dpdfd.clip_norm=0.0001 --seed 2
probe eps1-c1e-4 --epsilon 1 --max-steps 1000 --set dpdfd.clip_norm=0.0001
probe eps10-c5e-3 --epsilon 10 --max-steps 2000
probe eps1-c1e-3 --epsilon 1 --max-steps 1000
exit 0
