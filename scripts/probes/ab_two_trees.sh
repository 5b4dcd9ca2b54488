#!/usr/bin/env bash
# Same-host A/B of two trees on a 4-GPU host: this tree against an older checkout (OLD_TREE, e.g. a
# `git archive` of the baseline), bench_two_models.py in processes mode, PAIR_A on GPUs 0-1 and
# PAIR_B on GPUs 2-3, one tree per GPU, the trees swapped between GPUs each repetition. Results and
# logs in $OUT/r; NEW and OLD: the two trees' full git revisions (the device copy's .git is stale).
#   NEW=sha OLD=sha OLD_TREE=.baseline OUT=DIR bash scripts/probes/ab_two_trees.sh REPS PAIR_A PAIR_B
set -u
reps=$1; pair_a=$2; pair_b=$3
export BENCH_GIT_DIRTY=0 PYTHONUNBUFFERED=1
mkdir -p $OUT/r
job() {  # gpu tree revision pair tag rep
  CUDA_VISIBLE_DEVICES=$1 BENCH_GIT_REVISION=$3 timeout 250 python3 $2/scripts/bench_two_models.py --modes processes \
    --pairs $4 --alone-seconds 8 --overhead-reps 1 --no-between --rep $6 \
    --out $OUT/r/bench_two_models_processes_$4_h100x4_$5_r$6.json >> $OUT/r/log_$5_$4.txt 2>&1
  echo "gpu $1 $5 $4 r$6 rc $?" >> $OUT/r/done.txt
}
for r in $(seq 1 $reps); do
  if [ $((r % 2)) = 1 ]; then g=(0 1 2 3); else g=(1 0 3 2); fi
  job ${g[0]} . $NEW $pair_a new $r & job ${g[1]} $OLD_TREE $OLD $pair_a old $r &
  job ${g[2]} . $NEW $pair_b new $r & job ${g[3]} $OLD_TREE $OLD $pair_b old $r & wait
done
