#!/bin/bash
# TEST DOUBLE of the driver check NGC's entrypoint runs before the command (written for the testbed,
# after the behaviour NVIDIA's entrypoint.d driver check shows, e.g. as copied in gbxu/EnvDeployment
# system_check/52-gpu-driver-version-check.sh): where the host driver's branch is older than
# CUDA_DRIVER_VERSION's, it prints the banner an NGC 26.x image printed on a Spark at 580.142
# (tests/captured/ngc-vllm-26.03-spark-banner.txt), then runs the command. The testbed has no CUDA, so
# it takes forward compatibility as available, as on a Spark. sparkcluster starts its containers with
# the entrypoint emptied, so only a plain `docker run` of the image prints it.
kmd=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1)
if [[ "$kmd" =~ ^[0-9]+(\.[0-9]+)*$ && -n "${CUDA_DRIVER_VERSION:-}" && "${kmd%%.*}" -lt "${CUDA_DRIVER_VERSION%%.*}" ]]; then
  echo
  echo "ERROR: This container was built for NVIDIA Driver Release ${CUDA_DRIVER_VERSION%.*} or later, but version ${kmd} was detected"
  echo "NOTE: CUDA Forward Compatibility mode ENABLED. Using CUDA $(echo "$CUDA_VERSION" | cut -d. -f1,2) driver version ${CUDA_DRIVER_VERSION} with kernel driver version ${kmd}."
fi
exec "$@"
