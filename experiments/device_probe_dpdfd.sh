#!/bin/bash
# Second lent-GPU call of 2026-11-26: DPDFD on Fashion-MNIST through the teacher-fitted generator
# (`--config teacher-generator`, quick preset, paper accounting) at the norm bound C = 1e-4 (the paper's ImageNet
# value): whole-pipeline seeds 1 and 2 at ε = 10 (seed 0 ran in the first call), seed 0 at ε = 1, and the preset's
# C on seed 0's stages at both ε. Installs what device_session.sh installs, then packs each finished run into
# $OUT/probe2.tgz as it goes.
# usage: bash experiments/device_probe_dpdfd.sh DEADLINE_SECONDS
T0=$(date +%s); DEADLINE=${1:-200}; PROBE_MIN_LEFT=25
source scripts/device_lib.sh
device_setup || exit 1
echo "setup $(( $(date +%s) - T0 ))s"
DPDFD=(dpdfd -d fashion-mnist --accounting paper --preset quick --config teacher-generator)
device_probe runs/probe2 eps10-c1e-4-seed1 "${DPDFD[@]}" --epsilon 10 --max-steps 2000 --set dpdfd.clip_norm=0.0001 --seed 1
device_probe runs/probe2 eps10-c1e-4-seed2 "${DPDFD[@]}" --epsilon 10 --max-steps 2000 --set dpdfd.clip_norm=0.0001 --seed 2
device_probe runs/probe2 eps1-c1e-4 "${DPDFD[@]}" --epsilon 1 --max-steps 1000 --set dpdfd.clip_norm=0.0001
device_probe runs/probe2 eps10-c5e-3 "${DPDFD[@]}" --epsilon 10 --max-steps 2000
device_probe runs/probe2 eps1-c1e-3 "${DPDFD[@]}" --epsilon 1 --max-steps 1000
exit 0
