# TEST DOUBLE of the driver check NGC's framework images source from entrypoint.d (its name as copied
# out of an NGC image in YiLiangBJ/aerial-cuda-accelerated-ran pyaerial/container/pyaerial_recipe.py@d399de75).
# Only where the kernel driver's branch is older than CUDA_DRIVER_VERSION's: with the compat driver
# running (_CUDA_COMPAT_STATUS from /etc/shinit_v2) the two lines NGC's vLLM 26.03 printed on a Spark at
# 580.142 (tests/captured/ngc-vllm-26.03-spark-banner.txt), else the refusal eugr/spark-vllm-docker#266
# quotes (tests/captured/eugr-266-refused-banner.txt), which is not fatal: the command still runs.
# NVIDIA's script (a copy: gbxu/EnvDeployment system_check/52-gpu-driver-version-check.sh) prints
# "Minor Version Compatibility mode ENABLED" instead of the refusal where the driver's CUDA has the same
# major and a lower minor and /dev/nvidiactl exists; on a Spark eugr#266 got the refusal for a CUDA 13.1
# image on 580 (CUDA 13.0), so the stand-in, a Spark's, refuses whenever the compat driver does not run.
if [ "${NVIDIA_CPU_ONLY:-}" != 1 ]; then
  _sc_kmd=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1)
  if [[ "${_sc_kmd}" =~ ^[0-9]+(\.[0-9]+)*$ && -n "${CUDA_DRIVER_VERSION:-}" && "${_sc_kmd%%.*}" -lt "${CUDA_DRIVER_VERSION%%.*}" ]]; then
    echo
    if [[ "${_CUDA_COMPAT_STATUS:-}" == "CUDA Driver OK" ]]; then
      echo "ERROR: This container was built for NVIDIA Driver Release ${CUDA_DRIVER_VERSION%.*} or later, but version ${_sc_kmd} was detected"
      echo "NOTE: CUDA Forward Compatibility mode ENABLED. Using CUDA $(echo "${CUDA_VERSION}" | cut -d. -f1,2) driver version ${CUDA_DRIVER_VERSION} with kernel driver version ${_sc_kmd}."
    else
      echo "ERROR: This container was built for NVIDIA Driver Release ${CUDA_DRIVER_VERSION%.*} or later, but"
      echo "       version ${_sc_kmd} was detected and compatibility mode is UNAVAILABLE."
      echo
      echo "       [[${_CUDA_COMPAT_STATUS:-}]]"
      sleep 2
    fi
  fi
  unset _sc_kmd
fi
