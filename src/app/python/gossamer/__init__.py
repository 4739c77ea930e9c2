"""Gossamer from Python: a PyTorch training loop of your own on Gossamer peers.

Your model, your data, your inner optimizer; Gossamer's outer optimizers, codecs, membership, joins
and catch-up underneath, the same runtime as ``gossamer peer``::

    import gossamer
    peer = gossamer.Peer(out="runs/a", listen="0.0.0.0:7000", join=["203.0.113.5:7000"], key="run.key")
    outer = gossamer.DiLoCo(model, optimizer, peer, steps=1000, inner_steps=50, codec="fp4_e2m1")
    while outer.training:
        x, y = batch(outer.shard, outer.shards, outer.next_step)
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        outer.step(loss=loss.item(), tokens=x.numel())

Every method of the registry has a class (DiLoCo, StreamingDiLoCo, NoLoCo, CO2, SparseLoCo,
MuLoCo, DDP, Local); their keyword arguments are the keys of the method's config section
(``gossamer config --keys``), ``train={...}`` and ``outer={...}`` set keys of those sections.
``DDP`` averages gradients before the optimizer's update: call ``outer.step()`` after
``loss.backward()`` *instead of* ``optimizer.step()`` (Gossamer steps the optimizer).

Every peer must start from the same weights: build the model after the same ``torch.manual_seed``
on every peer (the weights' digest is part of the run's spec: a peer whose model differs is refused).

The out folder holds what ``gossamer peer`` writes: config.toml, metrics.jsonl, checkpoint.bin,
summary.json. ``gossamer.Peer(..., resume=True)`` restarts from its checkpoint.
"""

import atexit
import hashlib
import json
import math
import os
import struct
import weakref

import torch  # first: LibTorch and its Python bindings, which the extension uses

from . import _gossamer

__all__ = ["Peer", "Outer", "methods"]

_live = weakref.WeakSet()


@atexit.register
def _close_all():
    # A loop left by an exception (Ctrl-C in the user's code) leaves its peer running: it leaves the
    # run before the interpreter goes.
    for outer in list(_live):
        try:
            outer.close()
        except Exception:  # noqa: BLE001 (nothing to do about it at exit)
            pass


def methods():
    """The outer methods of the registry, by their config names."""
    return list(_gossamer.methods())


class Peer:
    """Where and how this process takes part in a run (the options of ``gossamer peer``).

    out: the run folder (new, or this peer's own with resume=True).
    listen: HOST:PORT of gossip (port 0: any free one; the links take PORT + 1 unless link_port).
    join: HOST:PORT of running peers; empty for the first peer, which defines the run.
    key: a file written by ``gossamer keygen`` (every peer of the run holds the same).
    wait_for: the first peer's: peers ready before training starts.
    """

    def __init__(self, out, listen="127.0.0.1:0", join=(), key=None, wait_for=1, advertise="", link_port=None,
                 outbound_only=False, resume=False, dead_after=1.0, start_timeout=600.0, join_timeout=60.0,
                 device=None, log_level="info"):
        if isinstance(join, str):
            join = [join]
        self.out = os.fspath(out)
        self.listen = listen
        self.join = [str(j) for j in join]
        self.key = os.fspath(key) if key else ""
        self.wait_for = int(wait_for)
        self.advertise = advertise
        self.link_port = link_port
        self.outbound_only = bool(outbound_only)
        self.resume = bool(resume)
        self.dead_after = float(dead_after)
        self.start_timeout = float(start_timeout)
        self.join_timeout = float(join_timeout)
        self.device = device or ""
        self.log_level = log_level

    @property
    def address(self):
        """The gossip address others --join (from the out folder; None until the peer listens)."""
        try:
            with open(os.path.join(self.out, "address")) as f:
                return f.readline().strip() or None
        except FileNotFoundError:
            return None


def _toml_value(key, value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{key} = {value}: a setting must be finite")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string is a JSON string
    raise TypeError(f"{key} = {value!r}: a setting is a bool, int, float or str")


def _toml(sections):
    lines = []
    for section, keys in sections.items():
        if not keys:
            continue
        lines.append(f"[{section}]")
        for key, value in keys.items():
            lines.append(f"{key} = {_toml_value(section + '.' + key, value)}")
    return "\n".join(lines) + "\n"


def _trainable(model):
    seen, out = set(), []
    for name, p in model.named_parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append((name, p))
    if not out:
        raise ValueError("the model has no trainable parameter")
    return out


def _signature(params):
    """The digest of the parameters' names, shapes, types and initial values."""
    h = hashlib.blake2b(digest_size=16)
    for name, p in params:
        t = p.detach().to("cpu").contiguous()
        h.update(f"{name}|{tuple(t.shape)}|{t.dtype}\n".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# The optimizer's state as bytes: a JSON header (sorted, so that equal states give equal bytes) and the
# tensors' raw bytes. Read back without unpickling anything: the bytes may come from another peer.
_MAGIC = b"GSPO\x01"
_DTYPES = {str(d).replace("torch.", ""): d for d in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
                                                     torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)}
_MAX_HEADER = 64 << 20


def _encode_optimizer(optimizer):
    tensors = []

    def enc(v):
        if isinstance(v, torch.Tensor):
            t = v.detach().to("cpu").contiguous()
            dtype = str(t.dtype).replace("torch.", "")
            if dtype not in _DTYPES:
                raise TypeError(f"optimizer state of type {t.dtype} is not supported")
            tensors.append(t)
            return {"t": len(tensors) - 1, "dtype": dtype, "shape": list(t.shape)}
        if isinstance(v, dict):
            return {"d": [[enc(k), enc(x)] for k, x in v.items()]}
        if isinstance(v, (list, tuple)):
            return {"l" if isinstance(v, list) else "u": [enc(x) for x in v]}
        if v is None or isinstance(v, (bool, int, float, str)):
            return {"v": v}
        raise TypeError(f"optimizer state holds a {type(v).__name__}, which is not saved")

    header = json.dumps(enc(optimizer.state_dict()), sort_keys=True, separators=(",", ":")).encode()
    blobs = [t.reshape(-1).view(torch.uint8).numpy().tobytes() for t in tensors]
    return _MAGIC + struct.pack("<Q", len(header)) + header + b"".join(blobs)


def _decode_optimizer(data):
    if len(data) < len(_MAGIC) + 8 or data[:len(_MAGIC)] != _MAGIC:
        raise ValueError("not an optimizer state (bad magic)")
    (n,) = struct.unpack_from("<Q", data, len(_MAGIC))
    start = len(_MAGIC) + 8
    if n > _MAX_HEADER or start + n > len(data):
        raise ValueError("optimizer state: its header runs past its end")
    tree = json.loads(data[start:start + n])
    offset = start + n
    tensors = {}

    def dec(node, depth=0):
        if depth > 64 or not isinstance(node, dict) or len(node) == 0:
            raise ValueError("optimizer state: a malformed entry")
        nonlocal offset
        if "t" in node:
            dtype, shape = _DTYPES.get(node.get("dtype")), node.get("shape")
            if dtype is None or not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
                raise ValueError("optimizer state: a malformed tensor")
            numel = math.prod(shape)
            size = numel * torch.empty((), dtype=dtype).element_size()
            if node["t"] != len(tensors) or offset + size > len(data):
                raise ValueError("optimizer state: a tensor runs past its end")
            raw = torch.frombuffer(bytearray(data[offset:offset + size]), dtype=torch.uint8) if size else torch.empty(0, dtype=torch.uint8)
            offset += size
            t = raw.view(dtype).reshape(shape)
            tensors[node["t"]] = t
            return t
        if "d" in node:
            return {dec(k, depth + 1): dec(v, depth + 1) for k, v in node["d"]}
        if "l" in node:
            return [dec(x, depth + 1) for x in node["l"]]
        if "u" in node:
            return tuple(dec(x, depth + 1) for x in node["u"])
        if "v" in node:
            return node["v"]
        raise ValueError("optimizer state: a malformed entry")

    state = dec(tree)
    if offset != len(data):
        raise ValueError("optimizer state: bytes past its end")
    if not isinstance(state, dict) or "state" not in state or "param_groups" not in state:
        raise ValueError("optimizer state: not a state_dict")
    return state


class Outer:
    """An outer optimizer over this process's model, as a peer of a Gossamer run.

    model: the torch.nn.Module trained (its trainable parameters are shared with the runtime).
    optimizer: its inner optimizer (checkpoints keep its state; ddp steps it, and newcomers take it).
    peer: a gossamer.Peer.
    steps: inner steps of the whole run.
    evaluate: optional callable returning a validation loss, called at train.eval_every and the end.
    block_pattern: a regular expression whose first group is the layer number in a parameter's name
        (for methods that cut the model into fragments along layers).
    train, outer: dicts of keys of those config sections; other keyword arguments: the method's keys.
    start: False to call load_state_dict() first, then start().
    """

    method = None

    def __init__(self, model, optimizer, peer, *, steps, evaluate=None, block_pattern=None, train=None, outer=None,
                 start=True, **settings):
        if self.method is None:
            raise TypeError("use one of the method classes (gossamer.DiLoCo, ...), or Outer.of(name)")
        if not isinstance(peer, Peer):
            raise TypeError("peer must be a gossamer.Peer")
        self.model, self.optimizer, self.peer = model, optimizer, peer
        params = _trainable(model)
        model_keys = {"kind": "external", "signature": _signature(params)}
        if block_pattern is not None:
            model_keys["block_pattern"] = block_pattern
        train_keys = {"steps": int(steps), "warmup_steps": 0}  # (the learning rate is the caller's optimizer's)
        train_keys.update(train or {})
        outer_keys = {"method": self.method}
        outer_keys.update(outer or {})
        self.config = _toml({"model": model_keys, "train": train_keys, "outer": outer_keys, self.method: settings})

        def update():
            self.optimizer.step()

        def load(data):
            self.optimizer.load_state_dict(_decode_optimizer(bytes(data)))

        self._runtime = _gossamer.Runtime(
            config=self.config, parameters=params, update=update, save_optimizer=lambda: _encode_optimizer(self.optimizer),
            load_optimizer=load, evaluate=evaluate, out=peer.out, listen=peer.listen, join=peer.join, advertise=peer.advertise,
            link_port=peer.link_port, outbound_only=peer.outbound_only, key=peer.key, resume=peer.resume, wait_for=peer.wait_for,
            dead_after=peer.dead_after, start_timeout=peer.start_timeout, join_timeout=peer.join_timeout, device=peer.device,
            log_level=peer.log_level)
        _live.add(self)
        if start:
            self.start()

    @staticmethod
    def of(name):
        """The class of a method by its config name ("diloco", "streaming_diloco", ...)."""
        try:
            return _CLASSES[name]
        except KeyError:
            raise ValueError(f"no method {name!r}; the methods: {', '.join(methods())}") from None

    def start(self):
        """Starts the peer: joins the run (fetching its state and catching up when it is under way) and
        returns once the model holds the run's weights and the first step may be made."""
        self._runtime.start()

    def step(self, loss=None, tokens=0):
        """Hands over the inner step just made (after optimizer.step(); for DDP instead of it) and
        returns once the next may be made: True, or False when the run is over."""
        lr = self.optimizer.param_groups[0].get("lr", float("nan")) if self.optimizer.param_groups else float("nan")
        return self._runtime.step(float("nan") if loss is None else float(loss), int(tokens), float(lr))

    @property
    def training(self):
        """True while the run wants another inner step of this peer."""
        return self._runtime.training

    @property
    def next_step(self):
        """The step about to be made (1 for a run's first): where a joiner or a resumed peer goes on."""
        return self._runtime.next_step

    @property
    def shard(self):
        """This peer's data shard, of `shards` (a newcomer gets one at random)."""
        return self._runtime.shard

    @property
    def shards(self):
        return self._runtime.shards

    @property
    def result(self):
        """Once the run is over: steps, rounds, digests, bytes, final validation loss (a dict), else None."""
        return self._runtime.outcome

    @property
    def summary(self):
        """summary.json of the out folder (as `gossamer peer` writes it), once the run is over."""
        try:
            with open(os.path.join(self.peer.out, "summary.json")) as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def state_dict(self):
        """The whole training state between two steps (weights, the optimizer's state, the outer
        optimizer's state, the step) for torch.save; load_state_dict() resumes from it."""
        return {"gossamer_checkpoint": self._runtime.state()}

    def load_state_dict(self, state):
        """Before start() (construct with start=False): resume from a state_dict(), in a new out folder."""
        self._runtime.load_state(state["gossamer_checkpoint"])

    def close(self):
        """Leaves the run (if it is not over) and joins the runtime."""
        self._runtime.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


_NAMES = {"ddp": "DDP", "diloco": "DiLoCo", "streaming_diloco": "StreamingDiLoCo", "noloco": "NoLoCo", "co2": "CO2",
          "sparseloco": "SparseLoCo", "muloco": "MuLoCo", "local": "Local"}
_CLASSES = {}
for _name in methods():
    _cls_name = _NAMES.get(_name) or "".join(part.capitalize() for part in _name.split("_"))
    _CLASSES[_name] = type(_cls_name, (Outer,), {"method": _name, "__doc__": f"Outer with outer.method = {_name}.\n\n" + Outer.__doc__})
    globals()[_cls_name] = _CLASSES[_name]
    __all__.append(_cls_name)
