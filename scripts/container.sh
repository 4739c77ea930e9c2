#!/usr/bin/env bash
# Builds a container image of Gossamer here, pulling from no registry: a Debian 12 root file system
# made by mmdebstrap from Debian's archive (through this machine's apt sources), with the gossamer
# binary and the shared libraries it loads added from this machine (Debian 12's own packages, as
# scripts/setup.sh installed them), imported into podman.
#
# Usage: scripts/container.sh [--binary path/to/gossamer] [--image NAME:TAG] [--keep-rootfs FILE]
# Default: build/src/app/gossamer, image gossamer:latest. Needs root, mmdebstrap and podman
# (apt-get install mmdebstrap podman). The image's entry point is gossamer; run it as
#   podman run --rm gossamer:latest --help
# (docs/deploy.md, "Containers", has a run of two peers on a podman network).
set -euo pipefail

BIN=build/src/app/gossamer
IMAGE=gossamer:latest
KEEP=""
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) BIN=$2; shift 2 ;;
    --image) IMAGE=$2; shift 2 ;;
    --keep-rootfs) KEEP=$2; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "container: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$BIN" ] || { echo "container: no binary at $BIN: build it first (scripts/build.sh, or ninja -C build gossamer)" >&2; exit 1; }
for tool in mmdebstrap podman ldd dpkg-query; do
  command -v "$tool" >/dev/null 2>&1 || { echo "container: $tool is missing: apt-get install mmdebstrap podman" >&2; exit 1; }
done
[ "$(id -u)" -eq 0 ] || { echo "container: run as root (mmdebstrap and podman build the image as root here)" >&2; exit 1; }

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# The shared libraries the binary loads, as the loader finds them, but C library's own (the root file
# system has the same from the archive).
echo "container: collecting the libraries $BIN loads"
libc_files=$(dpkg-query -L libc6 | sort -u)
mapfile -t libs < <(ldd "$BIN" | awk '/=> \//{print $3} /^[[:space:]]*\/[^ ]*ld-linux/{print $1}' | sort -u | grep -vxF -f <(echo "$libc_files") || true)
mkdir -p "$WORK/add/usr/local/bin"
install -m 0755 "$BIN" "$WORK/add/usr/local/bin/gossamer"
# Each under its folder's real path (/lib is a link to /usr/lib on Debian 12: a folder of that name in
# the archive would replace the link in the root file system).
for lib in "${libs[@]}"; do
  dir=$(realpath "$(dirname "$lib")")
  mkdir -p "$WORK/add$dir"
  cp -L "$lib" "$WORK/add$dir/"
done
tar -C "$WORK/add" -cf "$WORK/add.tar" usr
echo "container: ${#libs[@]} libraries, $(du -sh "$WORK/add" | cut -f1) with the binary"

# This machine's apt sources (deb822 or one-line), so the archive is the one it installs from.
sources=""
for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
  [ -s "$f" ] && grep -qv '^\s*#' "$f" && { sources=$f; break; }
done
[ -n "$sources" ] || { echo "container: no apt sources on this machine to build the root file system from" >&2; exit 1; }

echo "container: building the root file system (mmdebstrap, Debian 12 minbase)"
mmdebstrap --quiet --variant=minbase --mode=root \
  --customize-hook="tar-in $WORK/add.tar /" \
  --customize-hook='chroot "$1" ldconfig 2>&1 | { grep -v "is not a symbolic link" || true; }' \
  --customize-hook='chroot "$1" /usr/local/bin/gossamer --help > /dev/null' \
  bookworm "$WORK/rootfs.tar" "$sources"
[ -n "$KEEP" ] && cp "$WORK/rootfs.tar" "$KEEP"

echo "container: importing into podman as $IMAGE"
podman import --quiet --change 'ENTRYPOINT ["/usr/local/bin/gossamer"]' --change 'WORKDIR /data' --change 'ENV LANG=C.UTF-8' \
  "$WORK/rootfs.tar" "$IMAGE" > /dev/null
echo "container: built $IMAGE ($(podman image inspect --format '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}'))"
