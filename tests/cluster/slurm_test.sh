#!/bin/bash
# examples/slurm/gossamer.sbatch on a real Slurm (label cluster): munge, slurmctld and slurmd from
# Debian's packages started on this machine with a throwaway config (one node, ports of their own),
# the script submitted with 3 tasks, and the run checked: every task's peer finished with the same
# parameters. Exits 77 (skipped) with the reason where Slurm cannot start (not root, not installed).
# Usage: slurm_test.sh path/to/gossamer path/to/gossamer.sbatch
set -u
HERE=$(dirname "$(realpath "$0")")
G=$(realpath "$1"); SCRIPT=$(realpath "$2")
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "starting slurmctld, slurmd and munged needs root"
for b in munged slurmctld slurmd sbatch sinfo scontrol; do
  command -v "$b" >/dev/null 2>&1 || skip "$b is not installed (apt-get install slurmctld slurmd slurm-client munge)"
done

WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  sleep 0.5
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  [ "${FAILED:-1}" -eq 0 ] && rm -rf "$WORK"
}
trap cleanup EXIT
FAILED=1
fail() { echo "FAIL: $*"; for f in "$WORK"/*.log "$WORK"/job.out; do [ -f "$f" ] && { echo "--- $f"; tail -n 25 "$f"; }; done; exit 1; }

# Free ports for the daemons (the peers take PORT.. from the job's environment).
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# The peers' ports sit below the kernel's ephemeral range (32768 and up by default), where no outgoing
# connection takes one of them first; the 8 from the base up are checked free.
free_block() {
  /usr/bin/python3 - <<'PY'
import random, socket
lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for _ in range(200):
    base = random.randrange(20000, max(20001, lo - 16))
    socks = []
    try:
        for p in range(base, base + 8):
            s = socket.socket(); s.bind(("127.0.0.1", p)); socks.append(s)
        print(base)
        break
    except OSError:
        pass
    finally:
        for s in socks: s.close()
PY
}
CTLD_PORT=$(free_port); SLURMD_PORT=$(free_port); PEER_PORT=$(free_block)
[ -n "$PEER_PORT" ] || fail "no 8 free ports below the ephemeral range for the peers"

# munge with a key and socket of its own
dd if=/dev/urandom of="$WORK/munge.key" bs=1024 count=1 status=none
chmod 400 "$WORK/munge.key"
munged --force --key-file="$WORK/munge.key" --socket="$WORK/munge.sock" --pid-file="$WORK/munged.pid" \
  --log-file="$WORK/munged.log" --seed-file="$WORK/munge.seed" || skip "munged does not start here: $(tail -n 3 "$WORK/munged.log" 2>/dev/null)"
PIDS+=("$(cat "$WORK/munged.pid")")

mkdir -p "$WORK/state" "$WORK/spool"
cat > "$WORK/slurm.conf" <<CONF
ClusterName=gossamertest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/munge
AuthInfo=socket=$WORK/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$WORK/state
SlurmdSpoolDir=$WORK/spool
SlurmctldPidFile=$WORK/slurmctld.pid
SlurmdPidFile=$WORK/slurmd.pid
SlurmctldLogFile=$WORK/slurmctld.log
SlurmdLogFile=$WORK/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=gnode NodeAddr=127.0.0.1 NodeHostname=$(hostname) CPUs=4 State=UNKNOWN
PartitionName=test Nodes=gnode Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF=$WORK/slurm.conf
slurmctld -D -i > "$WORK/slurmctld.out" 2>&1 &
PIDS+=($!)
slurmd -D -N gnode > "$WORK/slurmd.out" 2>&1 &
PIDS+=($!)
up=0
for _ in $(seq 150); do
  if sinfo -h -n gnode -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then up=1; break; fi
  sleep 0.2
done
if [ $up -eq 0 ]; then
  echo "slurmctld: $(tail -n 5 "$WORK/slurmctld.log" 2>/dev/null)"; echo "slurmd: $(tail -n 5 "$WORK/slurmd.log" 2>/dev/null; tail -n 5 "$WORK/slurmd.out")"
  skip "Slurm did not bring its node up here (state: $(sinfo -h -n gnode -o '%T' 2>&1))"
fi
echo "slurm: slurmctld and slurmd up, node gnode $(sinfo -h -n gnode -o '%T')"

# The run: a tiny DiLoCo over 3 tasks, with a key every task reads.
"$G" keygen --out "$WORK/run.key" > /dev/null || fail "keygen"
cp "$HERE/run.toml" "$WORK/run.toml"
cd "$WORK"
GOSSAMER=$G CONFIG=$WORK/run.toml KEY=$WORK/run.key OUT=$WORK/runs PORT=$PEER_PORT \
  timeout 300 sbatch --wait --overcommit --ntasks=3 --output="$WORK/job.out" "$SCRIPT" > "$WORK/sbatch.log" 2>&1
rc=$?
job=$(sed -n 's/^Submitted batch job \([0-9]*\).*/\1/p' "$WORK/sbatch.log")
[ -n "$job" ] || fail "sbatch did not submit: $(cat "$WORK/sbatch.log")"
[ $rc -eq 0 ] || fail "job $job ended with $rc"
digests=()
for t in 0 1 2; do
  s=$WORK/runs/$job/task$t/summary.json
  [ -f "$s" ] || fail "task $t of job $job wrote no summary"
  grep -q '"finished": true' "$s" || fail "task $t did not finish"
  digests+=("$(sed -n 's/.*"params_digest": "\([0-9a-f]*\)".*/\1/p' "$s")")
done
[ "${digests[0]}" = "${digests[1]}" ] && [ "${digests[0]}" = "${digests[2]}" ] || fail "the tasks' parameters differ: ${digests[*]}"
grep -q "done; summaries" "$WORK/job.out" || fail "the job's output lacks its last line"
echo "slurm: job $job, 3 tasks as 3 peers finished with identical parameters (${digests[0]:0:16})"
FAILED=0
