#!/bin/bash
# TEST DOUBLE of NVIDIA's container loader, /opt/nvidia/nvidia_entrypoint.sh (the mechanism as NVIDIA's
# CUDA images ship it, e.g. the copy of NVIDIA's container-images/cuda in wimjan123/cuda11.7-gptj-training
# nvidia_entrypoint.sh@b727a63c): a bash script, so the image's BASH_ENV (/etc/bash.bashrc, which
# sources /etc/shinit_v2) has run the forward-compatibility probe before the first line here; then
# every /opt/nvidia/entrypoint.d part in order, `.txt` printed and `.sh` sourced into this same shell;
# then the command exec'd, so it and everything it spawns inherit what the start-up exported.
shopt -s nullglob extglob
for _part in /opt/nvidia/entrypoint.d/*@(.txt|.sh); do
  case "${_part}" in
    *.txt) cat "${_part}" ;;
    *.sh) source "${_part}" ;;
  esac
done
unset _part
echo
if [[ $# -eq 0 ]]; then
  exec /bin/bash
else
  exec "$@"
fi
