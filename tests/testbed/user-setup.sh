#!/bin/bash
# Runs INSIDE a testbed host (its mount namespace, as root, through nsenter) and gives it the account
# a DGX Spark's SSH user is: an ordinary user (uid TB_UID, its own home, a member of `docker`, no sudo
# rule at all), as DGX OS's first boot creates it and NVIDIA's playbooks add it to `docker`.
# The hosts share the machine's root filesystem, so the account lives in this host's own copies of
# /etc/passwd, /etc/group, /etc/shadow and /etc/gshadow (bind-mounted over the machine's, which are
# never changed) and its home in a private /home. Idempotent: a second run only refreshes the key.
# Environment: TB_USER TB_UID; stdin: the controller's public key (authorized_keys)
set -euo pipefail
u=$TB_USER; id=$TB_UID
key=$(cat)
etc=/run/testbed/etc
if ! mountpoint -q /home || [ ! -d "/home/$u" ]; then
  mkdir -p "$etc"
  # the machine's entries, less any that would clash with ours (its own uid/gid 1000 account)
  awk -F: -v u="$u" -v id="$id" '$1 != u && $3 != id' /etc/passwd > "$etc/passwd"
  printf '%s:x:%s:%s:DGX Spark owner (testbed):/home/%s:/bin/bash\n' "$u" "$id" "$id" "$u" >> "$etc/passwd"
  awk -F: -v u="$u" -v id="$id" 'BEGIN { OFS = ":" } $1 == u || $3 == id { next }
       $1 == "docker" { $4 = ($4 == "" ? u : $4 "," u); seen = 1 } { print } END { if (!seen) print "docker:x:998:" u }' \
      /etc/group > "$etc/group"
  printf '%s:x:%s:\n' "$u" "$id" >> "$etc/group"
  # no password: key login only (`*` is "no password", not a locked account, for sshd)
  awk -F: -v u="$u" '$1 != u' /etc/shadow > "$etc/shadow"
  printf '%s:*:20000:0:99999:7:::\n' "$u" >> "$etc/shadow"
  awk -F: -v u="$u" 'BEGIN { OFS = ":" } $1 == u { next } $1 == "docker" { $4 = ($4 == "" ? u : $4 "," u) } { print }' \
      /etc/gshadow > "$etc/gshadow" 2>/dev/null || true
  printf '%s:!::\n' "$u" >> "$etc/gshadow"
  chmod 644 "$etc/passwd" "$etc/group"; chmod 640 "$etc/shadow" "$etc/gshadow"
  for f in passwd group shadow gshadow; do
    mountpoint -q "/etc/$f" || mount --bind "$etc/$f" "/etc/$f"
  done
  mountpoint -q /home || mount -t tmpfs -o mode=755,size=8g tb-home /home
  install -d -m 750 -o "$id" -g "$id" "/home/$u"
  for f in .bashrc .profile; do [ -e "/etc/skel/$f" ] && install -m 644 -o "$id" -g "$id" "/etc/skel/$f" "/home/$u/$f"; done
fi
install -d -m 700 -o "$id" -g "$id" "/home/$u/.ssh"
printf '%s\n' "$key" > "/home/$u/.ssh/authorized_keys"
chown "$id:$id" "/home/$u/.ssh/authorized_keys"; chmod 600 "/home/$u/.ssh/authorized_keys"
# the GPU stand-ins where an ordinary account finds them: sshd gives it no sbin on its PATH (on a
# Spark, nvidia-smi and the toolkit are in /usr/bin); an overlay, so the machine's /usr/local/bin is untouched
if ! mountpoint -q /usr/local/bin; then
  mkdir -p /run/testbed/ubin/up /run/testbed/ubin/work
  mount -t overlay tb-ubin -o lowerdir=/usr/local/bin,upperdir=/run/testbed/ubin/up,workdir=/run/testbed/ubin/work /usr/local/bin
fi
for b in nvidia-smi ibdev2netdev nvidia-container-runtime-hook nvidia-ctk; do
  [ -e "/usr/local/sbin/$b" ] && ln -sfn "/usr/local/sbin/$b" "/usr/local/bin/$b"
done
# the Docker socket belongs to group docker (dockerd does so itself when the group exists at its start)
if [ -S /run/docker.sock ]; then chgrp docker /run/docker.sock && chmod 660 /run/docker.sock; fi
# no sudo rule for this account anywhere: it gets what a member of `docker` gets, nothing more
if [ -d /etc/sudoers.d ] && grep -rqs -E "^[[:space:]]*$u[[:space:]]" /etc/sudoers /etc/sudoers.d; then
  echo "a sudo rule names $u on this machine: the testbed's user must have none" >&2; exit 1
fi
