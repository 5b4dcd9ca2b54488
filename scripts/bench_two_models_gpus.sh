#!/usr/bin/env bash
# bench_two_models.py on a host with several GPUs: one MODE:PAIR per GPU, in the order given (GPU 0
# first), each pinned to the CPUs of its GPU's NUMA node, REPS repetitions in a row numbered from
# FIRST, all GPUs at once. Extra options for every run in $BENCH_ARGS. Writes results and logs to $OUT.
#   OUT=DIR bash scripts/bench_two_models_gpus.sh REPS FIRST processes:r18b4-r50b16 threads:r18b4-r50b64 ...
set -u
reps=$1; first=$2; shift 2
run_on() {  # gpu mode pair
  gpu=$1; mode=$2; pair=$3; name=${mode}_${pair}
  bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i $gpu | tr 'A-F' 'a-f' | sed 's/^0000//')
  node=$(cat /sys/bus/pci/devices/$bus/numa_node 2>/dev/null || echo -1)
  cpus=$( [ "$node" -ge 0 ] && cat /sys/devices/system/node/node$node/cpulist || echo 0-$(($(nproc)-1)) )
  echo "gpu $gpu bus $bus numa $node cpus $cpus" > $OUT/topo_$name.txt
  for r in $(seq $first $((first+reps-1))); do
    CUDA_VISIBLE_DEVICES=$gpu taskset -c $cpus python3 scripts/bench_two_models.py --modes $mode --pairs $pair \
      --alone-seconds 8 --overhead-reps 1 ${BENCH_ARGS:-} --rep $r --out $OUT/bench_two_models_${name}_r$r.json \
      >> $OUT/log_${name}.txt 2>&1
  done
}
gpu=0
for job in "$@"; do
  run_on $gpu ${job%%:*} ${job#*:} &
  gpu=$((gpu+1))
done
wait
