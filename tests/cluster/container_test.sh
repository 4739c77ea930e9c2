#!/bin/bash
# The container image (label cluster): scripts/container.sh builds it here (once per binary: its tag
# is the binary's digest), and two peers run to the end in two containers on a podman network of their
# own, with the same parameters at both. Exits 77 (skipped) with the reason where containers cannot
# run (not root, podman or mmdebstrap missing, no root file system to build).
# Usage: container_test.sh path/to/gossamer path/to/scripts/container.sh
set -u
HERE=$(dirname "$(realpath "$0")")
G=$(realpath "$1"); BUILD_IMAGE=$(realpath "$2")
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "building and running the image needs root"
for b in podman mmdebstrap; do command -v "$b" >/dev/null 2>&1 || skip "$b is not installed (apt-get install podman mmdebstrap)"; done

WORK=$(mktemp -d)
NET=gossamer-test-$$
FAILED=1
cleanup() {
  podman rm -f "$NET-p0" "$NET-p1" > /dev/null 2>&1
  podman network rm -f "$NET" > /dev/null 2>&1
  [ $FAILED -eq 0 ] && rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$WORK"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 20 "$f"; }; done; exit 1; }

TAG=gossamer:test-$(sha256sum "$G" | cut -c1-16)
if ! podman image exists "$TAG"; then
  echo "container: building $TAG"
  "$BUILD_IMAGE" --binary "$G" --image "$TAG" > "$WORK/build.log" 2>&1 || {
    grep -qiE "could not resolve|failed to fetch|temporary failure|network is unreachable" "$WORK/build.log" && skip "no Debian archive reachable to build the root file system: $(tail -n 2 "$WORK/build.log")"
    fail "scripts/container.sh failed"
  }
fi

# How podman runs containers on this machine: its defaults, or (where the kernel refuses crun's cgroup
# setup or raising the limits) runc with the limits as they are.
RUN=(podman run)
if ! podman run --rm "$TAG" --version > "$WORK/probe.log" 2>&1; then
  RUN=(podman --runtime runc run --ulimit "nofile=$(ulimit -n):$(ulimit -Hn)" --ulimit "nproc=1000:1000")
  "${RUN[@]}" --rm "$TAG" --version > "$WORK/probe2.log" 2>&1 || skip "podman cannot run containers here: $(tail -n 1 "$WORK/probe.log"); with runc: $(tail -n 1 "$WORK/probe2.log")"
fi
echo "container: $("${RUN[@]}" --rm "$TAG" --version 2>&1 | head -n 1)"

# A network of their own in a benchmark range, fixed addresses, the run folders mounted from here.
SUBNET=198.18.$(( RANDOM % 200 + 20 )).0
podman network create --subnet "$SUBNET/24" "$NET" > /dev/null || fail "podman network create"
A0=${SUBNET%.0}.10; A1=${SUBNET%.0}.11
cp "$HERE/run.toml" "$WORK/run.toml"
"$G" keygen --out "$WORK/run.key" 2> /dev/null || fail "keygen"
mkdir -p "$WORK/p0" "$WORK/p1"
"${RUN[@]}" -d --name "$NET-p0" --network "$NET" --ip "$A0" -v "$WORK:/data" "$TAG" \
  peer --config /data/run.toml --key /data/run.key --listen "$A0:7000" --wait-for 2 --out /data/p0/run > /dev/null || fail "starting peer 0"
"${RUN[@]}" -d --name "$NET-p1" --network "$NET" --ip "$A1" -v "$WORK:/data" "$TAG" \
  peer --join "$A0:7000" --key /data/run.key --listen "$A1:7000" --out /data/p1/run > /dev/null || fail "starting peer 1"
rc0=$(timeout 240 podman wait "$NET-p0"); rc1=$(timeout 240 podman wait "$NET-p1")
podman logs "$NET-p0" > "$WORK/p0.log" 2>&1; podman logs "$NET-p1" > "$WORK/p1.log" 2>&1
[ "$rc0" = 0 ] && [ "$rc1" = 0 ] || fail "the peers exited with $rc0 and $rc1"
d=()
for p in p0 p1; do
  s=$WORK/$p/run/summary.json
  [ -f "$s" ] || fail "$p wrote no summary"
  grep -q '"finished": true' "$s" || fail "$p did not finish"
  d+=("$(sed -n 's/.*"params_digest": "\([0-9a-f]*\)".*/\1/p' "$s")")
done
[ "${d[0]}" = "${d[1]}" ] || fail "the containers' parameters differ: ${d[*]}"
echo "container: 2 peers in 2 containers on $SUBNET/24 finished with identical parameters (${d[0]:0:16})"
FAILED=0
