#!/usr/bin/env bash
# Installs the Debian packages the testbed needs, only when one is missing.
set -euo pipefail
need=()
for pair in dockerd:docker.io sshd:openssh-server debootstrap:debootstrap ip:iproute2 \
            ping:iputils-ping ethtool:ethtool pkill:procps fuser:psmisc mkfs.ext4:e2fsprogs \
            losetup:mount update-ca-certificates:ca-certificates \
            earlyoom:earlyoom flock:util-linux curl:curl \
            promtool:prometheus amtool:prometheus-alertmanager; do
  cmd=${pair%%:*}; pkg=${pair#*:}
  command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
