#!/usr/bin/env python3
"""Join time against state size and link speed, in the simulator (the real runtime over emulated links).

Three diloco workers train on links of 1000 Mbit/s (20 ms one way); worker 3 of 4
joins at step 7 behind a link of 10, 100 or 1000 Mbit/s. Rounds last 10 s (10 steps of a fixed 1 s).
For each model width (state size) and link it prints the state's size, the floor (bytes / bandwidth),
the snapshot's transfer time (state_transfer_s), the updates fetched to catch up, and the whole join's (state_fetch_s: from asking to
taking part, the wait for the next round boundary included), the rounds the run went on meanwhile,
the donors' slowdown while serving (virtual time of the last round before the newcomer took part,
against a run without a newcomer) and the most memory the kept updates took.

With --killed, instead: the newcomer is killed half-way through its snapshot's transfer and starts
again 5 s later (sim.crash_worker = sim.join_worker); it prints what it kept of the snapshot, what it
fetched again, and its join against the same join uninterrupted.

--codec=NAME sets diloco's codec (default fp32; with a quantized one the kept updates are the codec's
bytes, so catching up costs less); --steps=N the run's length (default 120; a large state on a slow
link needs more rounds to join before the run ends).

Usage: scripts/bench_join.py GOSSAMER [--killed] [--codec=NAME] [--steps=N] [WIDTH ...]
"""
import json
import os
import subprocess
import sys
import tempfile

gossamer = sys.argv[1]
args = sys.argv[2:]
killed = "--killed" in args
codec = next((a.split("=", 1)[1] for a in args if a.startswith("--codec=")), "fp32")
steps = int(next((a.split("=", 1)[1] for a in args if a.startswith("--steps=")), "120"))
widths = [int(w) for w in args if not w.startswith("--")] or [128, 256, 512]
links = [10, 100, 1000]


def run(width, link, join, kill_at=None):
    out = tempfile.mkdtemp(prefix="bench-join-")
    sets = {
        "outer.method": "diloco", "sim.workers": 4, "train.steps": steps, "diloco.inner_steps": 10, "diloco.codec": codec,
        "sim.compute": "fixed", "sim.step_time_s": 1, "model.layers": 4, "model.width": width, "model.heads": 4,
        "model.context": 32, "train.batch_size": 2, "train.eval_every": steps, "sim.network": "custom",
        "sim.bandwidth_mbit": 1000, "sim.latency_ms": 20,
    }
    if join:
        sets.update({"sim.join_worker": 3, "sim.join_at_step": 7, "sim.slow_link_workers": 1, "sim.slow_link_mbit": link})
    if kill_at is not None:
        sets.update({"sim.crash_worker": 3, "sim.crash_at_step": kill_at, "sim.crash_restart_s": 5})
    cmd = [gossamer, "sim", "--out", out]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    records = [json.loads(line) for line in open(os.path.join(out, "diloco", "metrics.jsonl"))]
    return records


def last(records, worker, key):
    found = [r for r in records if r.get("worker") == worker and key in r]
    return found[-1] if found else None


if killed:
    # The snapshot's transfer starts at the boundary after step 7 (step 10, t = 10 s): killed when the
    # run reaches the step half-way through it.
    print(f"{'width':>5} {'link Mbit/s':>11} {'state MB':>9} {'kept MB':>8} {'fetched again MB':>16} {'transfer s':>10} "
          f"{'uninterrupted s':>15} {'joins':>5}")
    for width in widths:
        for link in [10, 100]:
            whole = last(run(width, link, True), 3, "joins")
            if whole is None:
                print(f"{width:>5} {link:>11}  the newcomer did not take part before the run ended")
                continue
            half = 10 + int(whole["state_transfer_s"] / 2) + 1
            joined = last(run(width, link, True, kill_at=half), 3, "joins")
            if joined is None:
                print(f"{width:>5} {link:>11}  killed at step {half}: the newcomer did not take part before the run ended")
                continue
            state = joined["state_snapshot_bytes"]
            kept = joined["state_resumed_bytes"]
            print(f"{width:>5} {link:>11} {state / 1e6:>9.2f} {kept / 1e6:>8.2f} {(state - kept) / 1e6:>16.2f} "
                  f"{joined['state_transfer_s']:>10.2f} {whole['state_transfer_s']:>15.2f} {joined['joins']:>5}")
    sys.exit(0)

print(f"{'width':>5} {'link Mbit/s':>11} {'state MB':>9} {'floor s':>8} {'transfer s':>10} {'transfer/floor':>14} {'join s':>7} "
      f"{'behind':>6} {'replayed':>8} {'updates MB':>10} {'donor slowdown':>14} {'kept MB':>8}")
for width in widths:
    base = run(width, 0, False)
    for link in links:
        records = run(width, link, True)
        joined = last(records, 3, "joins")
        if joined is None:
            print(f"{width:>5} {link:>11}  the newcomer did not take part before the run ended")
            continue
        state = joined["state_snapshot_bytes"]
        floor = state * 8 / (link * 1e6)
        # The donors while serving: worker 0's time to the last round before the newcomer took part,
        # against the run without a newcomer (the newcomer's own link slows the rounds after).
        first = min(r["step"] for r in records if r["worker"] == 3)
        served_until = max(r["step"] for r in records if r["worker"] == 0 and r["step"] < first and r["step"] % 10 == 0)
        t = lambda rs: next(r["time_s"] for r in rs if r["worker"] == 0 and r["step"] == served_until)
        kept = max((r.get("update_log_bytes", 0) for r in records if r["worker"] != 3), default=0)
        print(f"{width:>5} {link:>11} {state / 1e6:>9.2f} {floor:>8.2f} {joined['state_transfer_s']:>10.2f} "
              f"{joined['state_transfer_s'] / floor:>14.2f} {joined['state_fetch_s']:>7.2f} {joined['join_rounds_behind']:>6} "
              f"{joined.get('updates_replayed', 0):>8} "
              f"{(joined['state_bytes_received'] - state) / 1e6:>10.2f} {t(records) / t(base):>14.3f} {kept / 1e6:>8.2f}")
