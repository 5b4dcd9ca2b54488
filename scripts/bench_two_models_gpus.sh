#!/usr/bin/env bash
# bench_two_models.py on a host with 4 GPUs: one pair (or the threads mode) per GPU, each pinned to the
# CPUs of its GPU's NUMA node, REPS repetitions in a row from FIRST. Writes to $OUT (results and logs).
#   OUT=DIR bash scripts/bench_two_models_gpus.sh REPS [FIRST]

reps=$1; first=${2:-1}
run_on() {  # gpu name args...
  gpu=$1; name=$2; shift 2
  bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i $gpu | tr 'A-F' 'a-f' | sed 's/^0000//')
  node=$(cat /sys/bus/pci/devices/$bus/numa_node 2>/dev/null || echo -1)
  cpus=$( [ "$node" -ge 0 ] && cat /sys/devices/system/node/node$node/cpulist || echo 0-$(($(nproc)-1)) )
  echo "gpu $gpu bus $bus numa $node cpus $cpus" > $OUT/topo_$name.txt
  for r in $(seq $first $((first+reps-1))); do
    CUDA_VISIBLE_DEVICES=$gpu taskset -c $cpus python3 scripts/bench_two_models.py "$@" --rep $r --out $OUT/bench_two_models_${name}_r$r.json >> $OUT/log_${name}.txt 2>&1
  done
}
run_on 0 processes_b16 --modes processes --pairs r18b4-r50b16 --strict --alone-seconds 8 --overhead-reps 1 &
run_on 1 processes_b64 --modes processes --pairs r18b4-r50b64 --strict --alone-seconds 8 --overhead-reps 1 &
run_on 2 processes_vit --modes processes --pairs encb1-vitb32 --strict --alone-seconds 8 --overhead-reps 1 &
run_on 3 threads_b16 --modes threads --pairs r18b4-r50b16 --strict --alone-seconds 8 --overhead-reps 1 &
wait
