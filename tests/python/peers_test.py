#!/usr/bin/python3
"""The Python package as users run it: peers as separate Python processes on this machine.

Usage: peers_test.py PACKAGE_DIR CASE     (CASE: diloco, streaming, ddp, methods, join, join_ddp, resume, state, errors)

Each case starts processes of examples/python/train.py (a plain PyTorch loop of its own model) or of
a small driver below, and checks what they wrote: identical shared state at every peer, a join that
catches up, a resume and a state_dict() that end bit for bit where an uninterrupted run ends, and
errors that say what to do.
"""

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "python", "train.py")
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

# A driver of the example's model for the cases that stop and restart a peer: it hands its state_dict
# to a file at --save-at and stops there, or starts from such a file.
DRIVER = r'''
import sys, json, torch, importlib.util
import torch.nn.functional as F
spec = importlib.util.spec_from_file_location("example", sys.argv[1]); ex = importlib.util.module_from_spec(spec); spec.loader.exec_module(ex)
import gossamer
a = json.loads(sys.argv[2])
data = torch.tensor(list(open(a["data"], "rb").read()), dtype=torch.long)
torch.manual_seed(1)
model = ex.CharModel(context=32, width=32, layers=2)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
peer = gossamer.Peer(out=a["out"], resume=a.get("resume", False), log_level="warn")
outer = gossamer.DiLoCo(model, opt, peer, steps=a["steps"], inner_steps=5, codec="int8", start=False,
                        train={"checkpoint_every": 10})
if "load" in a:
    outer.load_state_dict(torch.load(a["load"]))
outer.start()
while outer.training:
    step = outer.next_step
    if step == a.get("save_at"):
        torch.save(outer.state_dict(), a["save"])
        outer.close()
        print(json.dumps({"saved_at": step}), flush=True)
        sys.exit(0)
    x, y = ex.batch(data, step, 0, 1, 4, 32, 1)
    loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
    opt.zero_grad(); loss.backward(); opt.step()
    print(json.dumps({"step": step}), flush=True)
    outer.step(loss=loss.item(), tokens=x.numel())
print(json.dumps(outer.result), flush=True)
'''


def text(path, seed, size=200_000):
    """Generated text (words of a random language, so nothing here was tuned on it)."""
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 8))) for _ in range(300)]
    out, n = [], 0
    while n < size:
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(4, 14))).capitalize() + ". "
        out.append(sentence)
        n += len(sentence)
    with open(path, "w") as f:
        f.write("".join(out)[:size])


class Procs:
    def __init__(self, package, workdir):
        self.env = dict(os.environ, PYTHONPATH=package, OMP_NUM_THREADS="1")
        self.workdir = workdir
        self.procs = []

    def start(self, args, name):
        log = open(os.path.join(self.workdir, name + ".log"), "w")
        p = subprocess.Popen([PYTHON] + args, stdout=subprocess.PIPE, stderr=log, env=self.env, text=True)
        p.name = name
        self.procs.append(p)
        return p

    def finish(self, p, timeout=240):
        out, _ = p.communicate(timeout=timeout)
        log = open(os.path.join(self.workdir, p.name + ".log")).read()
        if p.returncode != 0:
            raise AssertionError(f"{p.name} exited {p.returncode}:\n{out}\n{log[-4000:]}")
        return out, log

    def kill_all(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()


def wait_for_file(path, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(path) and open(path).read().strip():
            return open(path).readline().strip()
        time.sleep(0.1)
    raise AssertionError(f"{path} did not appear")


def summary(out):
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)


def example_args(data, out, method, steps, extra=()):
    return [EXAMPLE, "--data", data, "--out", out, "--method", method, "--steps", str(steps), "--batch", "8", "--context", "32",
            "--inner-steps", "10", "--eval-every", "1000"] + list(extra)


def three_peers(procs, work, data, method, steps, extra=()):
    outs = [os.path.join(work, f"p{i}") for i in range(3)]
    first = procs.start(example_args(data, outs[0], method, steps, ["--peers", "3"] + list(extra)), f"{method}0")
    address = wait_for_file(os.path.join(outs[0], "address"))
    others = [procs.start(example_args(data, outs[i], method, steps, ["--join", address] + list(extra)), f"{method}{i}") for i in (1, 2)]
    for p in [first] + others:
        procs.finish(p)
    return [summary(o) for o in outs]


def check_identical(sums, steps, what):
    for s in sums:
        assert s["finished"], f"{what}: a peer did not finish: {s}"
        assert s["steps"] == steps, f"{what}: {s['steps']} steps, expected {steps}"
    digests = {s["shared_digest"] for s in sums}
    assert len(digests) == 1, f"{what}: the peers' shared state differs: {digests}"


def case_diloco(procs, work, data):
    sums = three_peers(procs, work, data, "diloco", 60)
    check_identical(sums, 60, "diloco")
    assert all(s["rounds"] == 6 for s in sums), [s["rounds"] for s in sums]
    assert all(s["bytes_sent"] > 0 for s in sums)
    assert all("final_val_loss" in s and s["final_val_loss"] < 5.0 for s in sums), [s.get("final_val_loss") for s in sums]
    # metrics.jsonl as the CLI writes it: one record per round at least
    lines = open(os.path.join(work, "p0", "metrics.jsonl")).read().splitlines()
    assert len(lines) >= 6, len(lines)


def case_streaming(procs, work, data):
    sums = three_peers(procs, work, data, "streaming_diloco", 60, ["--codec", "int8"])
    check_identical(sums, 60, "streaming_diloco")
    assert all(s["rounds"] > 0 for s in sums)


def case_ddp(procs, work, data):
    sums = three_peers(procs, work, data, "ddp", 20)
    check_identical(sums, 20, "ddp")
    # ddp's members hold the same weights, not only the same shared state
    assert len({s["params_digest"] for s in sums}) == 1, [s["params_digest"] for s in sums]


def case_methods(procs, work, data):
    # the other methods of the registry, each across 3 processes
    for method in ("noloco", "co2", "sparseloco", "muloco"):
        sub = os.path.join(work, method)
        os.makedirs(sub)
        sums = three_peers(procs, sub, data, method, 40)
        for s in sums:
            assert s["finished"] and s["steps"] == 40, (method, s)
            assert s["rounds"] > 0 and s["bytes_sent"] > 0, (method, s)
        if method != "noloco":  # (NoLoCo's members differ by design: pairs average, nobody holds one state)
            check_identical(sums, 40, method)


def case_join(procs, work, data, method="diloco"):
    outs = [os.path.join(work, f"j{i}") for i in range(3)]
    # (long enough that the newcomer comes while it runs, on a loaded machine too: at 200 it once came
    # at round 14 of 20, and the run ended while it fetched the state)
    steps = 1500 if method == "ddp" else 400
    first = procs.start(example_args(data, outs[0], method, steps, ["--peers", "2"]), "join0")
    address = wait_for_file(os.path.join(outs[0], "address"))
    second = procs.start(example_args(data, outs[1], method, steps, ["--join", address]), "join1")
    # the newcomer comes once the run is under way (one of the two led round 3: the leader is the lower id)
    deadline = time.time() + 120
    while time.time() < deadline and not any("round 3: leading" in open(os.path.join(work, f"join{i}.log")).read() for i in (0, 1)):
        time.sleep(0.1)
    late = procs.start(example_args(data, outs[2], method, steps, ["--join", address]), "join2")
    for p in (first, second, late):
        procs.finish(p)
    sums = [summary(o) for o in outs]
    check_identical(sums, steps, f"{method} join")
    assert sums[2]["joins"] == 1, sums[2]
    assert sums[2]["state_snapshot_bytes"] > 0, sums[2]
    if method == "ddp":  # the newcomer took the members' optimizer state too: the same weights at the end
        assert len({s["params_digest"] for s in sums}) == 1, [s["params_digest"] for s in sums]


def case_join_ddp(procs, work, data):
    # ddp's newcomer takes the members' inner optimizer state (the caller's, as bytes every member
    # writes alike, from several donors at once)
    case_join(procs, work, data, "ddp")


def driver(procs, work, data, name, **a):
    a["data"] = data
    p = procs.start(["-c", DRIVER, EXAMPLE, json.dumps(a)], name)
    out, log = procs.finish(p)
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")], log


def case_state(procs, work, data):
    # state_dict() at step 23, load_state_dict() in a new process: the end is the uninterrupted run's
    whole, _ = driver(procs, work, data, "whole", out=os.path.join(work, "whole"), steps=40)
    saved, _ = driver(procs, work, data, "first", out=os.path.join(work, "first"), steps=40, save_at=23, save=os.path.join(work, "s.pt"))
    assert saved[-1] == {"saved_at": 23}, saved[-1]
    rest, _ = driver(procs, work, data, "rest", out=os.path.join(work, "rest"), steps=40, load=os.path.join(work, "s.pt"))
    assert rest[0] == {"step": 23}, rest[0]
    assert rest[-1]["finished"] and whole[-1]["finished"]
    assert rest[-1]["params_digest"] == whole[-1]["params_digest"], (rest[-1], whole[-1])
    assert rest[-1]["shared_digest"] == whole[-1]["shared_digest"]


def case_resume(procs, work, data):
    # Ctrl-C mid-run (the peer leaves and checkpoints), then resume=True: the end is the uninterrupted run's
    whole, _ = driver(procs, work, data, "whole", out=os.path.join(work, "whole"), steps=60)
    out = os.path.join(work, "cut")
    a = {"data": data, "out": out, "steps": 60}
    p = procs.start(["-c", DRIVER, EXAMPLE, json.dumps(a)], "cut")
    step = 0
    for line in p.stdout:
        if line.startswith("{") and json.loads(line).get("step", 0) >= 27:
            step = json.loads(line)["step"]
            p.send_signal(signal.SIGINT)
            break
    p.communicate(timeout=120)
    log = open(os.path.join(work, "cut.log")).read()
    assert step >= 27, "the run ended before it could be interrupted"
    assert p.returncode != 0 and "KeyboardInterrupt" in log, log[-2000:]
    assert os.path.exists(os.path.join(out, "checkpoint.bin"))
    resumed, log = driver(procs, work, data, "resumed", out=out, steps=60, resume=True)
    steps = [r["step"] for r in resumed if "step" in r]
    # from the checkpoint written when it stopped (between two steps), or the last periodic one (in the
    # middle of a step of its own: that step is not in any checkpoint)
    assert steps and 21 <= steps[0] <= step + 1, (steps[:3], step)
    assert resumed[-1]["finished"], resumed[-1]
    assert resumed[-1]["params_digest"] == whole[-1]["params_digest"], (resumed[-1], whole[-1])


def case_errors(procs, work, data):
    # what users get wrong says what to do
    script = r'''
import sys, torch, gossamer
m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
opt = torch.optim.SGD(m.parameters(), lr=0.1)
try:
    gossamer.DiLoCo(m, opt, gossamer.Peer(out=sys.argv[1]), steps=10, inner_steps=0)
except ValueError as e:
    print("E1", e)
try:
    gossamer.DiLoCo(m, opt, gossamer.Peer(out=sys.argv[1]), steps=10, no_such_key=1)
except ValueError as e:
    print("E2", e)
try:
    gossamer.Outer.of("nonesuch")
except ValueError as e:
    print("E3", e)
try:
    gossamer.DiLoCo(m, opt, gossamer.Peer(out=sys.argv[1], listen="256.1.1.1:1"), steps=100, inner_steps=10)
except ValueError as e:
    print("E4", e)
'''
    p = procs.start(["-c", script, os.path.join(work, "e")], "errors")
    out, log = procs.finish(p)
    lines = dict(line.split(" ", 1) for line in out.splitlines() if line[:2] in ("E1", "E2", "E3", "E4"))
    assert "diloco.inner_steps" in lines.get("E1", ""), out
    assert "no_such_key" in lines.get("E2", ""), out
    assert "diloco" in lines.get("E3", ""), out
    assert "--listen" in lines.get("E4", "") or "listen" in lines.get("E4", ""), out
    # a joiner whose model starts from other weights is refused, and told why
    model = r'''
import sys, torch, gossamer
torch.manual_seed(int(sys.argv[2]))
m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
opt = torch.optim.SGD(m.parameters(), lr=0.1)
join = [open(sys.argv[3]).readline().strip()] if len(sys.argv) > 3 else []
try:
    gossamer.DiLoCo(m, opt, gossamer.Peer(out=sys.argv[1], join=join, wait_for=2, start_timeout=30), steps=100, inner_steps=10)
except ValueError as e:
    print("E5", e)
'''
    first = procs.start(["-c", model, os.path.join(work, "f0"), "1"], "first")
    address = wait_for_file(os.path.join(work, "f0", "address"))
    other = procs.start(["-c", model, os.path.join(work, "f1"), "2", os.path.join(work, "f0", "address")], "other")
    out, _ = procs.finish(other, timeout=120)
    assert "E5" in out and "torch.manual_seed" in out and "initial weights" in out, out
    assert address
    first.kill()


CASES = {"diloco": case_diloco, "streaming": case_streaming, "ddp": case_ddp, "methods": case_methods, "join": case_join, "join_ddp": case_join_ddp, "state": case_state,
         "resume": case_resume, "errors": case_errors}


def main():
    package, case = sys.argv[1], sys.argv[2]
    work = tempfile.mkdtemp(prefix=f"gossamer-py-{case}-")
    data = os.path.join(work, "text.txt")
    text(data, seed=sum(case.encode()))
    procs = Procs(package, work)
    try:
        CASES[case](procs, work, data)
    finally:
        procs.kill_all()
    print(f"python {case}: passed ({work})")


if __name__ == "__main__":
    main()
