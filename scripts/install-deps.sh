#!/usr/bin/env bash
# Installs what pstrain needs on Debian 12 (bookworm). Idempotent: packages
# already installed are skipped, and apt-get runs only when something is missing.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config ccache git clang-format
  libzmq3-dev cppzmq-dev                     # transport
  libprotobuf-dev protobuf-compiler          # wire headers and configs
  libgflags-dev libgoogle-glog-dev           # flags and logging
  libgtest-dev libgmock-dev                  # tests
  clang libclang-rt-14-dev libomp-dev        # tests: thread-safety analysis and the fuzzers
  libdnnl-dev                                # CPU kernels (oneDNN)
  ocl-icd-opencl-dev                         # Debian's oneDNN is built with an OpenCL GPU
                                             # runtime: its CMake package requires OpenCL
  libjpeg62-turbo-dev libpng-dev zlib1g-dev  # image pipeline
  libcurl4-openssl-dev ca-certificates      # `pstrain data`: fetching data sets (HTTPS)
  openssh-server openssh-client rsync        # ssh launcher (and its tests)
  openmpi-bin libopenmpi-dev                 # mpi launcher (and its tests; the default mpirun)
  mpich                                      # mpi launcher tests under MPICH (mpirun.mpich)
  slurm-wlm munge                            # slurm launcher (its tests run a one-node cluster)
  procps iproute2                            # ps/kill in tests, addresses
  python3 python3-pil                        # tests: the independent RecordIO writer
  tmux                                       # tests: the live view of a job on a terminal
  python3-venv                               # ONNX export tests: a venv with ONNX Runtime
                                             # from pip (scripts/onnx_python_env.sh)
  python3-dev pybind11-dev                   # the Python package (python/)
  python3-numpy python3-setuptools python3-pip  # its tests, `pip install .`
  python3-torch                              # its PyTorch tests (pstrain.torch)
)
# Benchmarks compare against PyTorch (which the tests install); the rest of
# what they use comes with PSTRAIN_BENCH_DEPS=1.
if [[ "${PSTRAIN_BENCH_DEPS:-0}" == "1" ]]; then
  PACKAGES+=(python3-torchvision iperf3)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
