#!/usr/bin/env bash
# Small-message all-reduce latency with real NCCL, two ranks (issue 59, item 2): perf/fabric_latency.py
# as two processes, each with its own environment as a node's would be. Each rank gets its own GPU
# where there are two; with one GPU both share it (NCCL, which refuses two ranks on one device of one
# host, then needs one NCCL_HOSTID per rank; the GPU then time-slices the two ranks' kernels, which
# is what such a run measures: perf/fabric_latency.md). The network runs give each rank its own
# NCCL_HOSTID, so NCCL sees two nodes, as two Sparks are, and takes its network transport (sockets:
# there is no RDMA device). Runs, each into <out>/latency-<run>-rank<r>.log:
#   socket   NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1, NCCL's own choice of algorithm and protocol
#   ring     as socket, plus the ring cabling's variables (config/topology.nccl_env("ring"))
#   ll       as socket, plus NCCL_PROTO=LL (the protocol NCCL picks itself for these sizes)
#   local    NCCL as it comes, one node (two GPUs: NVLink or PCIe peer access): NCCL's own floor,
#            no network in the path (with one GPU: NCCL's refusal)
# Usage: perf/fabric_latency.sh OUTDIR [RUNS]. Run from the checkout's root. NVLink multicast stays off.
set -u
out=${1:?output folder}; runs=" ${2:-socket ring ll local} "
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,TUNING PYTHONUNBUFFERED=1 MASTER_ADDR=127.0.0.1

net="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 HOSTSPLIT"
pair() {  # pair RUN PORT EXTRA_ENV (HOSTSPLIT in it: one NCCL_HOSTID per rank)
  local run=$1 port=$2 extra=$3 r dev hostid pids=()
  for r in 0 1; do
    dev=$(( gpus >= 2 ? r : 0 ))
    hostid=""
    [[ $extra == *HOSTSPLIT* ]] && hostid="NCCL_HOSTID=fabric-node-$r"
    env CUDA_VISIBLE_DEVICES=$dev RANK=$r LOCAL_RANK=0 WORLD_SIZE=2 MASTER_PORT=$port \
      ${extra//HOSTSPLIT/} $hostid timeout 120 python3 "$here/fabric_latency.py" \
      >"$out/latency-$run-rank$r.log" 2>&1 &
    pids+=($!)
  done
  for r in 0 1; do wait "${pids[$r]}"; echo "$run rank$r exit $?"; done
  grep -h -e ^SPARKCLUSTER_LATENCY -e "via " -e "Using network" -e "WARN" "$out/latency-$run-rank0.log" | sort -u | head -24
}

ringenv=$(PYTHONPATH=. python3 -c 'from sparkcluster.config.topology import nccl_env
print(" ".join(f"{k}={v}" for k, v in sorted(nccl_env("ring").items())))')
want() { [[ $runs == *" $1 "* ]]; }
start=$(date +%s)
want socket && pair socket 29521 "$net"
want ring && pair ring 29522 "$net $ringenv"
want ll && pair ll 29523 "$net NCCL_PROTO=LL"
want local && pair local 29524 ""
echo "fabric_latency: $(( $(date +%s) - start )) s, $gpus GPU(s)"
