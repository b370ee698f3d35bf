#!/bin/bash
# Runs INSIDE a new testbed host (its own net, mount, UTS, IPC and PID namespaces, entered with
# nsenter) and makes it look like a DGX Spark from the inside. Mounts made here live in the host's
# private mount namespace only; they vanish with it.
# Environment: TB_NAME TB_REPO(the checkout) TB_STATE(host state dir) TB_BIN(stand-in scripts) TB_DISK(ext4 image or "")
#              TB_DISK_MB(tmpfs size if no image) TB_NETDEVS TB_HCAS (space separated, paired by position)
#              TB_DRIVER
set -euo pipefail

hostname "$TB_NAME"

# private state: nothing shared with the other host through the common root filesystem
mount -t tmpfs -o mode=755,size=2g tb-run /run
mkdir -p /run/sshd /run/lock /run/testbed/bin /run/testbed/sysfs /run/nvidia-standin /run/docker
# the host's kernel-log stand-in (issue 75): testbed-runc binds it over /dev/kmsg in a container given
# the device, and Testbed.kernel_line appends /dev/kmsg records to it
: > /run/testbed/kmsg
chmod 755 /run/sshd
# the checkout (state dir, stand-ins, build context) may sit under /tmp or /root, which become
# private below: pin it first, then bind it back at its own path so every path we were given works
mkdir -p /run/testbed/repo
mount --bind "$TB_REPO" /run/testbed/repo
mount -t tmpfs -o mode=1777,size=4g tb-tmp /tmp
# root's home of its own (a fresh Debian one), so /root/.cache, ~/.config etc. are per host
mount -t tmpfs -o mode=700,size=8g tb-root /root
cp /etc/skel/.bashrc /etc/skel/.profile /root/ 2>/dev/null || true
mkdir -p /root/.cache
case "$TB_REPO" in
  /tmp/*|/root/*) mkdir -p "$TB_REPO" && mount --bind /run/testbed/repo "$TB_REPO" ;;
esac
mount -t tmpfs -o mode=755,size=1g tb-sparkcluster /var/lib/sparkcluster
mount -t tmpfs -o mode=1777 tb-shm /dev/shm
mount --bind "$TB_STATE/etc-hosts" /etc/hosts
mount --bind "$TB_STATE/resolv.conf" /etc/resolv.conf
mount --bind "$TB_STATE/etc-docker" /etc/docker   # daemon.json, engine key: per host

# docker's disk: a real filesystem of its own so `df` and "disk full" are real
if [ -n "$TB_DISK" ]; then
  mount -o loop "$TB_DISK" /var/lib/docker
else
  mount -t tmpfs -o "mode=711,size=${TB_DISK_MB}m" tb-docker /var/lib/docker
fi
chmod 711 /var/lib/docker

# GPU stand-ins first on root's PATH (/usr/local/sbin): nvidia-smi, the toolkit's hook and runtime
mkdir -p /run/testbed/sbin
mount -t tmpfs -o mode=755,size=16m tb-sbin /run/testbed/sbin
cp -a /usr/local/sbin/. /run/testbed/sbin/ 2>/dev/null || true   # keep what the machine has there
mount --move /run/testbed/sbin /usr/local/sbin
install -m 755 "$TB_BIN/nvidia-smi" "$TB_BIN/ibdev2netdev" "$TB_BIN/nvidia-container-runtime-hook" "$TB_BIN/nvidia-ctk" /usr/local/sbin/
# the NVIDIA toolkit's runtime (registered as dockerd's `nvidia` runtime, like on a Spark) and, first
# on dockerd's PATH only, `runc` itself: both are testbed-runc, which edits the bundle and execs the real runc
install -m 755 "$TB_BIN/testbed-runc" /usr/local/sbin/nvidia-container-runtime
install -m 755 "$TB_BIN/testbed-runc" /run/testbed/bin/runc
echo "$TB_DRIVER" > /run/nvidia-standin/driver_version
echo "$TB_NAME" > /run/nvidia-standin/hostname

# sysfs: /sys/class/infiniband does not exist here and sysfs is read-only, so /sys/class becomes a
# tmpfs with every real class bind-mounted back from a fresh sysfs (live for this netns) plus a
# fake `infiniband` class.
mount -t sysfs tb-sysfs /run/testbed/sysfs
mount -t tmpfs -o mode=755,size=16m tb-sysclass /sys/class
for d in /run/testbed/sysfs/class/*; do
  n=${d##*/}
  mkdir -p "/sys/class/$n"
  mount --bind "$d" "/sys/class/$n"
done
read -r -a netdevs <<<"$TB_NETDEVS"
read -r -a hcas <<<"$TB_HCAS"
mkdir -p /sys/class/infiniband /sys/class/infiniband_verbs
for i in "${!hcas[@]}"; do
  h=${hcas[$i]}; nd=${netdevs[$i]}; d=/sys/class/infiniband/$h
  mkdir -p "$d/ports/1" "$d/device/net/$nd"
  echo "4: ACTIVE" > "$d/ports/1/state"
  echo "5: LinkUp" > "$d/ports/1/phys_state"
  echo "Ethernet" > "$d/ports/1/link_layer"
  echo "200 Gb/sec (2X NDR)" > "$d/ports/1/rate"
  echo "1: CA" > "$d/node_type"
  echo "MT4129" > "$d/hca_type"
  echo "$nd" > "$d/device/net/$nd/ifname"
  # the PCI device's link and the firmware, as a GB10's ConnectX-7 reads them (Gen5 x4; issue 39's
  # rdma.pcie and rdma.firmware; the testbed narrows one with Testbed.set_hca_link_width)
  echo 4 > "$d/device/current_link_width"; echo 4 > "$d/device/max_link_width"
  echo "32.0 GT/s PCIe" > "$d/device/current_link_speed"; echo "32.0 GT/s PCIe" > "$d/device/max_link_speed"
  echo "28.45.4028" > "$d/fw_ver"
  # the PCI function's AER counters (issue 59's rdma.aer), none since boot, in the kernel's format
  # (a count per error type, then the TOTAL_ line: Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats);
  # the testbed counts a fatal one with Testbed.set_hca_aer
  printf 'RxErr 0\nBadTLP 0\nBadDLLP 0\nRollover 0\nTimeout 0\nNonFatalErr 0\nCorrIntErr 0\nHeaderOF 0\nTOTAL_ERR_COR 0\n' > "$d/device/aer_dev_correctable"
  printf 'Undefined 0\nDLP 0\nSDES 0\nTLP 0\nFCP 0\nCmpltTO 0\nMalfTLP 0\nECRC 0\nUnsupReq 0\nTOTAL_ERR_FATAL 0\n' > "$d/device/aer_dev_fatal"
  printf 'Undefined 0\nDLP 0\nSDES 0\nTLP 0\nFCP 0\nCmpltTO 0\nMalfTLP 0\nECRC 0\nUnsupReq 0\nTOTAL_ERR_NONFATAL 0\n' > "$d/device/aer_dev_nonfatal"
  # the GID table (gids/N, gid_attrs/types/N, gid_attrs/ndevs/N): empty here; the testbed writes it
  # from the cabling mode (tests/testbed/cabling.py), a RoCE v2 IPv4 GID per address at index 3
  mkdir -p "$d/ports/1/gids" "$d/ports/1/gid_attrs/types" "$d/ports/1/gid_attrs/ndevs"
  mkdir -p "/sys/class/infiniband_verbs/uverbs$i"
  echo "$h" > "/sys/class/infiniband_verbs/uverbs$i/ibdev"
done

# link speed: veths report 10000 Mb/s; a Spark's ConnectX-7 ports report 200000
mkdir -p /run/testbed/speed
for nd in "${netdevs[@]}"; do
  echo 200000 > "/run/testbed/speed/$nd"
  mount --bind "/run/testbed/speed/$nd" "/sys/class/net/$nd/speed"
done

# /dev/infiniband: character devices as the mlx5 driver makes them (no driver behind them here)
mount -t tmpfs -o mode=755,size=1m tb-devib /dev/infiniband
for i in "${!hcas[@]}"; do
  mknod -m 666 "/dev/infiniband/uverbs$i" c 231 $((192 + i))
done
mknod -m 666 /dev/infiniband/rdma_cm c 10 254

# `ip netns exec` remounted /sys, which hid the cgroup mounts dockerd needs
mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup
for c in cpu cpuacct cpuset memory devices freezer blkio pids; do
  mkdir -p "/sys/fs/cgroup/$c"
  mount -t cgroup -o "$c" cgroup "/sys/fs/cgroup/$c"
done
mkdir -p /sys/fs/cgroup/systemd /sys/fs/cgroup/unified
mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd
mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified || true
