#!/usr/bin/env bash
# Installs every Debian package Gossamer needs to build, test and benchmark.
# Idempotent: packages already present are skipped, and the script says what it installs.
# Usage: scripts/setup.sh [main]   (runs apt-get as root, or through sudo when not root)
#   main: only what building the gossamer command needs (scripts/run.sh's quick start)
set -euo pipefail

MAIN_PACKAGES=(
  # toolchain
  build-essential cmake ninja-build ccache pkg-config git
  # compute: LibTorch (CPU) and the optimized BLAS it must use (reference BLAS is ~10x slower)
  libtorch-dev libopenblas0-pthread
  # transport, codecs, security
  libasio-dev libzmq3-dev cppzmq-dev libzstd-dev libsodium-dev libgloo-dev
  # support libraries
  libspdlog-dev libfmt-dev nlohmann-json3-dev libtomlplusplus-dev libcli11-dev
  # tests and benchmarks (the build declares them)
  doctest-dev libbenchmark-dev
)
PACKAGES=("${MAIN_PACKAGES[@]}"
  # iproute2 and nftables: peers on hosts of their own, behind NAT, in the net tests
  iproute2 nftables
  # PyTorch of the same version as libtorch-dev, with NumPy: the Python package (with pybind11) runs
  # on it; the tests make TorchScript models and nanoGPT / llm.c token files as those tools do, and
  # load exported weights back into PyTorch
  python3-torch python3-numpy python3-dev pybind11-dev
  # a real Slurm for examples/slurm (munge, slurmctld, slurmd), and the container image built and run
  # here (scripts/container.sh: mmdebstrap, podman, with runc where crun cannot run)
  slurmctld slurmd slurm-client munge mmdebstrap podman runc
)
[ "${1:-}" = main ] && PACKAGES=("${MAIN_PACKAGES[@]}")

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} required packages are already installed"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
  else
    echo "setup: need root to install: ${missing[*]}" >&2
    echo "setup: run this script as root, or install sudo" >&2
    exit 1
  fi
fi

echo "setup: installing ${#missing[@]} package(s): ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done"
