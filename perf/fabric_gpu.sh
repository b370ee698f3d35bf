#!/usr/bin/env bash
# The fabric test's node-side part on one host with GPUs (issue #26, item 5): two ranks of
# sparkcluster/node/fabric_probe.py, each a process with its own environment as a node would have,
# NCCL's INFO log captured per rank. Runs, each into <out>/device-<run>-rank<r>.log:
#   default  NCCL as it comes (on one GPU NCCL refuses two ranks on one device: a real failure log)
#   socket   network transport forced: NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1; with fewer than two
#            GPUs each rank also gets its own NCCL_HOSTID, so NCCL sees two nodes (as two Sparks are)
#   ib       as socket, plus NCCL_NET=IB (on a host without an HCA: NCCL's own refusal)
#   gloo     the gloo backend (CPU tensors), up to 64 MiB: what the testbed runs
#   ring     a ring's containers as sparkcluster starts them (issue 35): the cabling's NCCL variables
#            from config/topology.nccl_env("ring") (NCCL_ALGO=Ring among them), the fabric test's
#            NCCL_DEBUG_SUBSYS=INIT,NET,ENV, and the probe's own NCCL_CUMEM_ENABLE=0 (as vLLM sets
#            it); one NCCL_HOSTID per rank, so NCCL sees two nodes and takes its network transport
#   ring-tuning  the same with GRAPH,TUNING added: which algorithms NCCL kept
# Usage: perf/fabric_gpu.sh PROBE OUTDIR [MAX_BYTES] [RUNS] (RUNS: the names above, space-separated;
# default all). NVLink multicast stays off (the lender's rule).
set -u
probe=${1:?probe path}; out=${2:?output folder}; max=${3:-1G}; runs=" ${4:-default socket ib gloo ring ring-tuning} "
mkdir -p "$out"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET PYTHONUNBUFFERED=1 MASTER_ADDR=127.0.0.1

pair() {  # pair RUN PORT EXTRA_ENV PROBE_ARGS: two ranks at once, each log kept apart
  local run=$1 port=$2 extra=$3 args=$4 r dev pids=()
  for r in 0 1; do
    dev=$(( gpus >= 2 ? r : 0 ))
    local hostid=""
    [[ $extra == *HOSTSPLIT* && $gpus -lt 2 ]] && hostid="NCCL_HOSTID=fabric-node-$r"
    env CUDA_VISIBLE_DEVICES=$dev RANK=$r LOCAL_RANK=0 WORLD_SIZE=2 MASTER_PORT=$port \
      ${extra//HOSTSPLIT/} $hostid timeout 150 python3 "$probe" $args \
      >"$out/device-$run-rank$r.log" 2>&1 &
    pids+=($!)
  done
  for r in 0 1; do wait "${pids[$r]}"; echo "$run rank$r exit $?"; done
  grep -h ^SPARKCLUSTER "$out/device-$run-rank0.log"
}

# the ring's variables exactly as the containers get them (run from the checkout's root)
ringenv=$(PYTHONPATH=. python3 -c 'from sparkcluster.config.topology import nccl_env
print(" ".join(f"{k}={v}" for k, v in sorted(nccl_env("ring").items())))')
want() { [[ $runs == *" $1 "* ]]; }
start=$(date +%s)
want default && pair default 29511 "" "--max-bytes $max"
want socket && pair socket 29512 "NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 HOSTSPLIT" "--max-bytes $max"
want ib && pair ib 29513 "NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=IB HOSTSPLIT" "--sizes 1M,16M"
want gloo && pair gloo 29514 "" "--backend gloo --max-bytes 64M"
want ring && pair ring 29515 "$ringenv NCCL_DEBUG_SUBSYS=INIT,NET,ENV HOSTSPLIT" \
  "--max-bytes $max --ops all_gather,all_reduce,p2p --budget 30"
want ring-tuning && pair ring-tuning 29516 "$ringenv NCCL_DEBUG_SUBSYS=INIT,NET,ENV,GRAPH,TUNING HOSTSPLIT" \
  "--sizes 1M,64M --ops all_gather,all_reduce"
echo "fabric_gpu: $(( $(date +%s) - start )) s, $gpus GPU(s)"
