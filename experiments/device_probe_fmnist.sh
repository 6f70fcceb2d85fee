#!/bin/bash
# One lent-GPU call of 2026-11-26 (docs/research-log.md, "Paper preset on a lent GPU"): two Fashion-MNIST paper-preset
# cells through device_session.sh, then quick-preset probes on CUDA that ask how far Fashion-MNIST's DPDFD (ε = 10)
# and SRR (ε = 1) cells move with what the papers' accountings leave free: DPDFD's clip norm C (its printed bound
# misses a factor C², so a smaller C buys less noise at the same paper ε) and SRR's number of labels (ε per label,
# no composition). Every probe's summary keeps both ε. Packs the probes' run directories into $OUT/probe.tgz.
# usage: bash experiments/device_probe_fmnist.sh DEADLINE_SECONDS
T0=$(date +%s); DEADLINE=${1:-560}; PROBE_MIN_LEFT=40
source scripts/device_lib.sh
bash scripts/device_session.sh 200 baseline-fashion-mnist dpsgd-fashion-mnist-eps1 2>&1
device_env
SRR=(srr -d fashion-mnist --epsilon 1 --accounting paper --preset quick --config staged-prior --set srr.stages=4
     --set srr.first_stage_fraction=0.25 --set srr.student_ema=0.995)
DPDFD=(dpdfd -d fashion-mnist --epsilon 10 --accounting paper --preset quick --config teacher-generator)
device_probe runs/probe dpdfd-eps10-c1e-4 "${DPDFD[@]}" --max-steps 2000 --set dpdfd.clip_norm=0.0001
device_probe runs/probe srr-eps1-n600k "${SRR[@]}" --set srr.num_samples=600000
device_probe runs/probe dpdfd-eps10-c1e-4-6000 "${DPDFD[@]}" --max-steps 6000 --set dpdfd.clip_norm=0.0001
device_probe runs/probe dpdfd-eps10 "${DPDFD[@]}" --max-steps 2000
exit 0
