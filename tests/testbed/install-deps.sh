#!/usr/bin/env bash
# Installs the Debian packages the testbed needs, only when one is missing, and the Docker Engine a
# Spark runs (issue 50): 28.x, started by the testbed with Docker 29's API floor (1.44).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export DEBIAN_FRONTEND=noninteractive
updated=
apt_update() { [ -n "$updated" ] || { apt-get update -qq; updated=1; }; }

need=()
for pair in sshd:openssh-server debootstrap:debootstrap ip:iproute2 \
            ping:iputils-ping ethtool:ethtool pkill:procps fuser:psmisc mkfs.ext4:e2fsprogs \
            losetup:mount update-ca-certificates:ca-certificates \
            earlyoom:earlyoom flock:util-linux curl:curl runc:runc \
            promtool:prometheus amtool:prometheus-alertmanager \
            chromium:chromium; do
  cmd=${pair%%:*}; pkg=${pair#*:}
  command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  apt_update
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# --- the Docker Engine -------------------------------------------------------------------------
# Sparks run Docker 28.x and 29.x (tests/captured/gb10-docker-info.json: 28.3.3; NVIDIA/NemoClaw#4658:
# 29.x; MiaAI-Lab GLM-5.3 #118: 29.2.1). Docker 29.0-29.2 refuse API clients below 1.44
# (docker/docs#23910); the testbed starts its engines with DOCKER_MIN_API_VERSION=1.44 (testbed.py),
# which dockerd honours since 25.0, so that a client that pins an old API fails here as it would on
# a Spark. Debian 12's own docker.io (20.10, API 1.41 at most) cannot do that, so it is not used.
MIN_MAJOR=25
engine_major() { dockerd --version 2>/dev/null | sed -n 's/^Docker version \([0-9]*\)\..*/\1/p'; }
have=$(engine_major || true)
if [ -z "$have" ] || [ "$have" -lt "$MIN_MAJOR" ]; then
  debs="$here/../../../shared/debs"
  if [ -f "$debs/SHA256SUMS" ]; then
    # the project's copy of Debian unstable's docker.io 28.5.2 (shared/debs/README.md)
    (cd "$debs" && sha256sum --quiet -c SHA256SUMS)
    echo "installing Docker Engine from $(cd "$debs" && pwd): $(cd "$debs" && ls ./*.deb | xargs -n1 basename | tr '\n' ' ')"
    apt_update
    apt-get install -y -qq --no-install-recommends "$debs"/*.deb >/dev/null
  else
    # no local copy: Debian's archive, through the mirror this machine's bookworm entry already names.
    # unstable's current docker.io where it installs beside Debian 12's libc; else Debian 13's (26.1.5)
    uri=$(sed -n 's/^URIs: *\([^ ]*\/debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
    [ -n "$uri" ] || uri=$(sed -n 's/^deb \([^ ]*\/debian\) bookworm .*/\1/p' /etc/apt/sources.list 2>/dev/null | head -1)
    [ -n "$uri" ] || { echo "install-deps: no Debian mirror configured; cannot fetch Docker Engine >= $MIN_MAJOR" >&2; exit 1; }
    list=/etc/apt/sources.list.d/sparkcluster-testbed-docker.list
    printf 'deb %s unstable main\ndeb %s trixie main\n' "$uri" "$uri" >"$list"
    # neither suite may replace anything else: only what is named with -t comes from them
    printf 'Package: *\nPin: release n=unstable\nPin-Priority: 100\n\nPackage: *\nPin: release n=trixie\nPin-Priority: 100\n' \
      >/etc/apt/preferences.d/sparkcluster-testbed-docker
    apt-get update -qq; updated=1
    pkgs=(docker.io docker-cli containerd tini-static)
    if apt-get install -y -qq --no-install-recommends --simulate -t unstable "${pkgs[@]}" >/dev/null 2>&1 \
       && ! apt-get install -y --no-install-recommends --simulate -t unstable "${pkgs[@]}" 2>/dev/null | grep -q '^Inst libc6 '; then
      echo "installing Docker Engine from Debian unstable (installs beside Debian 12's libc)"
      apt-get install -y -qq --no-install-recommends -t unstable "${pkgs[@]}" >/dev/null
    else
      echo "installing Docker Engine from Debian 13 (unstable's needs a newer libc)"
      apt-get install -y -qq --no-install-recommends -t trixie docker.io >/dev/null
    fi
  fi
  have=$(engine_major || true)
fi
if [ -z "$have" ] || [ "$have" -lt "$MIN_MAJOR" ]; then
  echo "install-deps: dockerd is $(dockerd --version 2>/dev/null || echo missing); the testbed needs Docker Engine >= $MIN_MAJOR" >&2
  exit 1
fi
# the engine's own service stays off: each testbed host starts its own dockerd
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  systemctl disable --now docker.service docker.socket containerd.service >/dev/null 2>&1 || true
fi
