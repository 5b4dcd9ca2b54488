#!/usr/bin/env bash
# Where a batch job's time goes next to a service (py-spy, raw samples), native and under `xsched-lv3 run`
# with default options. The service starts first (its model warm), the batch job 12 s later under
# py-spy; summarise with scripts/pyspy_summary.py. Writes to $OUT.
#   OUT=DIR PYSPY=py-spy bash scripts/probes/pyspy_lp.sh "--model resnet18 --batch 4" "--model resnet50 --batch 16"
set -u
hp_args=$1; lp_args=$2; py=python3
for variant in native xsched; do
  hp_run=(); lp_run=()              # the prefix each program starts with: none natively
  if [ $variant = xsched ]; then
    hp_run=($py -m xsched_lv3 run --priority 10 --); lp_run=($py -m xsched_lv3 run --)
  fi
  XSCHED_LV3_REPORT=$OUT/${variant}_hp_report.json "${hp_run[@]}" $py scripts/workloads/serve.py $hp_args \
    --seconds 40 </dev/null > $OUT/${variant}_hp.out 2>&1 &
  service=$!
  sleep 12
  XSCHED_LV3_REPORT=$OUT/${variant}_lp_report.json "${lp_run[@]}" $PYSPY record -r 200 --idle --threads -f raw \
    -o $OUT/pyspy_${variant}.txt -- $py scripts/workloads/batch.py $lp_args --seconds 20 </dev/null > $OUT/${variant}_lp.out 2>&1
  wait $service
done
