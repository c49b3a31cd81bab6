#!/usr/bin/env bash
# rlplay's checks on a machine with a CUDA GPU, in one run:
#   1. the CUDA and page-locked tests, by name (test_cuda.py runs them under
#      fork, spawn and forkserver, checks that no forked worker initialises
#      CUDA, and that 50 device runs leave the device memory as it was);
#   2. benchmarks/gpu.py (bandwidth, delivery, training, central inference);
#   3. the whole suite but the notebooks (XDIST=N spreads it over N
#      processes with pytest-xdist where it is installed).
# Logs go to the folder given as the first argument (default gpu-check).
#
#     PYTHON=python3 XDIST=8 bash benchmarks/gpu_check.sh OUTDIR
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOGS=${1:-gpu-check}
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max --format=csv;
  $PY -c "import torch, gymnasium, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0), '| gymnasium', gymnasium.__version__, '| numpy', numpy.__version__)"; nproc; } 2>&1 | tee "$LOGS/device.log"
rc=0
timeout "${CUDA_TESTS_S:-240}" $PY -m pytest -p no:cacheprovider -v -rs \
    tests/test_cuda.py tests/test_shared.py tests/test_same.py \
    tests/test_single.py -k "cuda or pinned or device or Delivery" 2>&1 \
    | tee "$LOGS/cuda_tests.log" || rc=1
timeout "${BENCH_S:-240}" $PY benchmarks/gpu.py --rounds "${ROUNDS:-3}" \
    --seconds "${SECONDS_PER_ROW:-2}" --json 2>&1 | tee "$LOGS/gpu.log" || rc=1
timeout "${SUITE_S:-300}" $PY -m pytest -p no:cacheprovider -q -rs \
    -m "not notebooks" ${XDIST:+-n "$XDIST"} --durations 15 2>&1 \
    | tee "$LOGS/suite.log" || rc=1
exit $rc
