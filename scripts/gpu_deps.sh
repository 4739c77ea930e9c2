#!/usr/bin/env bash
# Fetches the Debian packages a GPU machine needs to build Gossamer against its own PyTorch's
# LibTorch, into .gpu-deps/ (git-ignored), for scripts/gpu_check.sh to unpack there with dpkg -x.
# Such a machine has PyTorch, CUDA, a compiler, CMake and ninja but nothing of Debian's archive and
# no network: the headers and libraries below travel with the working tree (about 5 MB). Gloo is
# not among them: PyTorch's LibTorch links its own and ships its headers, and those must be used.
# Usage: scripts/gpu_deps.sh        (on a Debian 12 machine with apt; no root needed)
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  # headers (and the libraries' link names)
  libasio-dev libzmq3-dev cppzmq-dev libzstd-dev libsodium-dev libspdlog-dev libfmt-dev
  nlohmann-json3-dev libtomlplusplus-dev libcli11-dev doctest-dev libbenchmark-dev
  # shared libraries they link to; gpu_check.sh keeps the machine's own copy of any it already has
  libzmq5 libsodium23 libspdlog1.10 libfmt9 libtomlplusplus3 libbenchmark1debian libzstd1 libnorm1
  libpgm-5.3-0 libbsd0 libmd0 libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libkeyutils1 libcom-err2
)

mkdir -p .gpu-deps
cd .gpu-deps
rm -f ./*.deb
echo "gpu_deps: downloading ${#PACKAGES[@]} packages into .gpu-deps/"
if ! apt-get download "${PACKAGES[@]}" >/dev/null 2>download.log; then
  cat download.log >&2
  echo "gpu_deps: apt-get download failed: run 'apt-get update' (as root) and try again" >&2
  exit 1
fi
rm -f download.log
echo "gpu_deps: $(ls ./*.deb | wc -l) files, $(du -sh . | cut -f1); carry .gpu-deps to the GPU machine with the working tree"
