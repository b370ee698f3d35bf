#!/bin/bash
# What a verified replication costs this machine's cores, part by part (issue 40 item 1): the CPU
# the whole machine spends (every core, from /proc/stat) per GB on
#   1. one raw TCP stream from spark-head to spark-worker over their control link (Python both ends,
#      bytes from memory, recv_into a reused buffer: no copy but the kernel's),
#   2. sha256 on one thread (what verifying a received file cannot avoid),
#   3. writing the bytes into the worker's HF cache filesystem with a final fsync (the testbed's
#      /home, a tmpfs), less one SSH round trip's own cost.
# Their sum is the least CPU a replication that receives, verifies and writes each byte can spend,
# with no framing, no pipe, no tar and the sender's read left out; two cores then bound its rate.
# Run as root on the testbed's machine with the testbed up and no cluster serving (an idle vLLM
# CPU engine spins a core): `bash perf/weights_cpu.sh`; writes perf/weights_cpu.md.
set -euo pipefail
cd "$(dirname "$0")/.."
SSH=(ssh -F .testbed/ssh_config)
GB=2
busy() { awk 'NR==1{print $2+$3+$4+$7+$8}' /proc/stat; }
declare -A COST RATE
run() {  # key, shell command
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; sleep 1
  local a b t0 t1
  a=$(busy); t0=$(date +%s.%N); eval "$2"; b=$(busy); t1=$(date +%s.%N)
  COST[$1]=$(python3 -c "import sys; print(f'{(float(sys.argv[2])-float(sys.argv[1]))/100/$GB:.3f}')" "$a" "$b")
  RATE[$1]=$(python3 -c "import sys; print(f'{$GB*1000/(float(sys.argv[2])-float(sys.argv[1])):.0f}')" "$t0" "$t1")
}
recv='import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("198.19.2.2", 5999)); s.listen(1)
c, _ = s.accept(); mv = memoryview(bytearray(1 << 20))
while c.recv_into(mv):
    pass'
send="import os, socket
b = os.urandom(1 << 20); s = socket.create_connection(('198.19.2.2', 5999))
for _ in range($GB * 1024):
    s.sendall(b)
s.close()"
hash_="import hashlib, os
b = os.urandom(1 << 20); h = hashlib.sha256()
for _ in range($GB * 1024):
    h.update(b)"
write="import os
b = os.urandom(1 << 20); p = os.path.expanduser('~/.cache/sparkcluster-cpu-probe'); f = open(p, 'wb', buffering=0)
for _ in range($GB * 1024):
    f.write(b)
os.fsync(f.fileno()); f.close(); os.unlink(p)"
for rep in 1 2 3; do
  run tcp "ip netns exec spark-worker python3 -c '$recv' & sleep 0.5; ip netns exec spark-head python3 -c \"\$send\"; wait"
  run sha256 "python3 -c \"\$hash_\""
  run write "${SSH[*]} spark-worker python3 - <<<\"\$write\""
  run ssh "${SSH[*]} spark-worker true"
  line=$(python3 -c "
import sys
tcp, sha, wr, ssh = map(float, sys.argv[1:5])
least = tcp + sha + (wr - ssh)
print(f'| {sys.argv[5]} | {tcp:.2f} | {sha:.2f} | {wr - ssh:.2f} | {least:.2f} | {2 / least * 1000:.0f} |')
" "${COST[tcp]}" "${COST[sha256]}" "${COST[write]}" "${COST[ssh]}" "$rep")
  rows+="$line"$'\n'
  echo "$line"
done
{
  echo "# What a verified replication costs this machine's cores (\`bash perf/weights_cpu.sh\`, $(date -u '+%Y-%m-%d %H:%M') UTC, $(nproc) CPUs)"
  echo
  echo "Core-seconds the whole machine spent per GB (every core, /proc/stat), no cluster serving."
  echo
  echo "| rep | raw TCP head -> worker | sha256, one thread | write + fsync into the HF cache fs | least a verified replication needs | its rate on two cores (MB/s) |"
  echo "|---|---:|---:|---:|---:|---:|"
  printf '%s' "$rows"
} > perf/weights_cpu.md
cat perf/weights_cpu.md
