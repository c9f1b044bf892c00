"""``python -m rnncore bench``: time rnncore against PyTorch and MLX where it runs.

For each configuration (one GRU or LSTM layer) and mode (inference: the forward;
training: the forward plus the gradients of the input and of every weight) rnncore runs
first; then each peer (PyTorch's ``nn.GRU`` / ``nn.LSTM`` and MLX's ``mlx.nn.GRU`` /
``mlx.nn.LSTM``) gets the same weights through the contract's mappings (docs/semantics.md,
"Mapping other frameworks onto the descriptors") and must agree with rnncore before it is
timed: the worst relative error ``||peer - rnncore|| / ||rnncore||`` over the outputs
compared is within ``TOLERANCE``. Times are medians of several runs after warm-up; the
peer's device is synchronised before the clock stops (``torch.mps.synchronize()``,
``mx.eval``). rnncore's calls return numpy arrays, so they end when the work has.

On "metal" the peers run on the GPU (torch device "mps", MLX's gpu stream); on "cpu" and
"metal-emulated" they run on the CPU, so the command can be exercised on any machine. A
peer that is not installed, or has no such device, is reported and skipped; the exit
status is 1 only if a peer disagrees with rnncore or rnncore fails.

The weights are drawn in PyTorch's layout (gate blocks r, z, n for the GRU; i, f, g, o for
the LSTM) and mapped onto rnncore as bench/problem.py does for the CPU benchmark.
"""

import importlib.util
import json
import platform
import statistics
import subprocess
import sys
import time
import zlib
from dataclasses import asdict, dataclass
from typing import Callable, Optional

import numpy as np

import rnncore

# Worst relative error a peer may have against rnncore (float16 is a storage type: the
# peers and rnncore round differently).
TOLERANCE = {"float32": 1e-3, "float16": 2e-2}

GATES = {"gru": 3, "lstm": 4}


@dataclass(frozen=True)
class Config:
    """One recurrent layer: kind ("gru": PyTorch's flavour, reset after, gates r, z, n;
    "lstm"), sizes and the dtype of every input and output."""

    kind: str
    T: int
    N: int
    I: int  # noqa: E741 (the contract's name for the input size)
    H: int
    dtype: str = "float32"

    @property
    def name(self):
        suffix = "" if self.dtype == "float32" else "-f16"
        return f"{self.kind}-T{self.T}-N{self.N}-I{self.I}-H{self.H}{suffix}"

    def describe(self):
        return f"{self.kind.upper()} T={self.T} N={self.N} I={self.I} H={self.H} {self.dtype}"


def _configs(sizes, float16_sizes):
    """A GRU and an LSTM of each (T, N, I, H) size, float32; then float16 ones."""
    configs = [Config(kind, *size) for size in sizes for kind in GATES]
    configs += [Config(kind, *size, "float16") for size in float16_sizes for kind in GATES]
    return configs


# (T, N, I, H); the float16 variants are those of the N = 32 cases.
CONFIGS = _configs(
    [(100, 1, 256, 256), (100, 32, 256, 256), (50, 128, 1024, 1024)], [(100, 32, 256, 256)]
)
QUICK = [c for c in CONFIGS if c.N != 128]
# metal-emulated --quick: sizes the host emulator runs in a moment.
EMULATED_QUICK = _configs([(5, 2, 16, 16)], [(5, 2, 16, 16)])

MODES = ("inference", "training")


# ---- the problem and the weight mappings ------------------------------------------------


@dataclass
class Problem:
    """Input x [T, N, I], upstream gradient dy = dL/dy [T, N, H] and the weights in PyTorch's
    layout (weight_ih [G*H, I], weight_hh [G*H, H], bias_ih, bias_hh [G*H]), all holding
    values of config.dtype (float16 numbers are rounded once, so every implementation
    gets the same ones)."""

    config: Config
    x: np.ndarray
    dy: np.ndarray
    params: dict


def make_problem(config, seed=None):
    """Random inputs and weights for `config` (seeded by its name unless `seed` is given)."""
    c = config
    rng = np.random.default_rng(zlib.crc32(c.name.encode()) if seed is None else seed)
    dtype = np.dtype(c.dtype)
    GH = GATES[c.kind] * c.H

    def normal(shape, scale):
        return np.ascontiguousarray((scale * rng.standard_normal(shape)).astype(dtype))

    params = {
        "weight_ih": normal((GH, c.I), 1.0 / np.sqrt(c.I)),
        "weight_hh": normal((GH, c.H), 0.8 / np.sqrt(c.H)),
        "bias_ih": normal((GH,), 0.2),
        "bias_hh": normal((GH,), 0.2),
    }
    return Problem(c, normal((c.T, c.N, c.I), 1.0), normal((c.T, c.N, c.H), 1.0), params)


def rnncore_descriptor(kind, training):
    """The descriptor of PyTorch's layers (semantics.md): the GRU is reset-after with the
    reset gate first (blocks r, z, n) and flip_z false (h = (1 - z) * n + z * h_prev);
    the LSTM has the default descriptor (blocks i, f, g, o)."""
    if kind == "gru":
        return rnncore.GRUDescriptor(
            reset_gate_first=True, reset_after=True, flip_z=False, training=training
        )
    return rnncore.LSTMDescriptor(training=training)


def rnncore_weights(kind, params):
    """rnncore's input_weight, recurrent_weight, bias (and the GRU's secondary_bias) from
    PyTorch's parameters, by the contract's mapping: weights as stored; GRU bias =
    [b_ir + b_hr, b_iz + b_hz, b_in] and secondary_bias = b_hn; LSTM bias = b_ih + b_hh."""
    b_ih, b_hh = params["bias_ih"], params["bias_hh"]
    weights = {"input_weight": params["weight_ih"], "recurrent_weight": params["weight_hh"]}
    if kind == "gru":
        H = b_ih.shape[0] // 3
        weights["bias"] = np.concatenate([b_ih[: 2 * H] + b_hh[: 2 * H], b_ih[2 * H :]])
        weights["secondary_bias"] = b_hh[2 * H :]
    else:
        weights["bias"] = b_ih + b_hh
    return {k: np.ascontiguousarray(v) for k, v in weights.items()}


def canonical_gradients(kind, grads):
    """Gradients of PyTorch-layout parameters (weight_ih, weight_hh, bias_ih, bias_hh) in
    rnncore's layout: with the mapping above, d bias = d bias_ih (each summed bias' b_hh
    part gets the same gradient) and the GRU's d secondary_bias = d bias_hh[n block]."""
    out = {"dW": grads["weight_ih"], "dR": grads["weight_hh"], "dbias": grads["bias_ih"]}
    if kind == "gru":
        H = grads["bias_hh"].shape[0] // 3
        out["db2"] = grads["bias_hh"][2 * H :]
    return out


def rel_err(actual, expected):
    """||actual - expected|| / ||expected|| in float64 (inf when the shapes differ)."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape:
        return float("inf")
    den = float(np.linalg.norm(e))
    num = float(np.linalg.norm(a - e))
    return num / den if den > 1e-30 else num


def worst_error(actual, expected):
    """The worst relative error over the fields of `expected`, and that field's name."""
    errs = {k: rel_err(actual[k], v) if k in actual else float("inf") for k, v in expected.items()}
    field = max(errs, key=lambda k: (np.nan_to_num(errs[k], nan=np.inf), k))
    err = errs[field]
    return (float("inf") if np.isnan(err) else err), field


# ---- implementations -----------------------------------------------------------------------
#
# prepare(problem, mode) returns (run, sync, result): run() is the timed work, sync() waits
# for the device (inside the timed region), result(run()) gives numpy arrays in rnncore's
# layout: "y" [T, N, H] for inference; "dx", "dW", "dR", "dbias" (and the GRU's "db2") for
# training.


def _no_sync():
    pass


class RnncoreImpl:
    """rnncore on the benchmarked device."""

    def __init__(self, device):
        self.device = device
        self.label = "rnncore"

    def prepare(self, problem, mode):
        c, device = problem.config, self.device
        w = rnncore_weights(c.kind, problem.params)
        R = w.pop("recurrent_weight")
        x, dy = problem.x, problem.dy
        forward = rnncore.gru if c.kind == "gru" else rnncore.lstm
        if mode == "inference":
            desc = rnncore_descriptor(c.kind, training=False)

            def run():
                return forward(x, R, **w, descriptor=desc, device=device)

            return run, _no_sync, lambda out: {"y": out.state}

        desc = rnncore_descriptor(c.kind, training=True)

        def run():
            out = forward(x, R, **w, descriptor=desc, device=device)
            if c.kind == "gru":
                return rnncore.gru_gradients(
                    x, R, dy, out.z_state, out.state, **w, descriptor=desc, device=device
                )
            return rnncore.lstm_gradients(
                x, R, dy, out.z_state, out.cell, **w, descriptor=desc, device=device
            )

        def result(g):
            r = {
                "dx": g.source,
                "dW": g.input_weight,
                "dR": g.recurrent_weight,
                "dbias": g.bias,
            }
            if c.kind == "gru":
                r["db2"] = g.secondary_bias
            return r

        return run, _no_sync, result


def torch_module(kind, params, device="cpu"):
    """nn.GRU / nn.LSTM (one layer, time-major) holding `params` (PyTorch's own layout, so
    they are copied as they are), in their dtype, on the torch device `device`."""
    import torch

    weight_ih = torch.from_numpy(np.ascontiguousarray(params["weight_ih"]))
    cls = torch.nn.GRU if kind == "gru" else torch.nn.LSTM
    module = cls(weight_ih.shape[1], params["weight_hh"].shape[1], dtype=weight_ih.dtype)
    with torch.no_grad():
        for name, value in params.items():
            getattr(module, name + "_l0").copy_(torch.from_numpy(np.ascontiguousarray(value)))
    return module.to(device)


class TorchImpl:
    """PyTorch's nn.GRU / nn.LSTM; training is forward + loss.backward() with
    loss = sum(y * dy), so dL/dy = dy as rnncore gets it."""

    def __init__(self, torch_device):
        import torch

        self.torch = torch
        self.device = self.where = torch_device
        self.label = f"torch ({torch_device})"
        self.sync = torch.mps.synchronize if torch_device == "mps" else _no_sync

    def prepare(self, problem, mode):
        torch, c = self.torch, problem.config
        module = torch_module(c.kind, problem.params, self.device)
        x = torch.from_numpy(problem.x).to(self.device)
        if mode == "inference":
            module.eval()

            def run():
                with torch.inference_mode():
                    return module(x)[0]

            return run, self.sync, lambda y: {"y": y.float().cpu().numpy()}

        module.train()
        x.requires_grad_(True)
        # The loss in float32, so a float16 sum cannot overflow; its gradient is dy.
        dy = torch.from_numpy(problem.dy.astype(np.float32)).to(self.device)
        params = list(module.parameters())

        def run():
            x.grad = None
            for p in params:
                p.grad = None
            y = module(x)[0]
            loss = (y.float() * dy).sum()
            loss.backward()
            return loss

        def result(_):
            grads = {
                name: getattr(module, name + "_l0").grad.float().cpu().numpy()
                for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
            }
            out = canonical_gradients(c.kind, grads)
            out["dx"] = x.grad.float().cpu().numpy()
            return out

        return run, self.sync, result


class MlxImpl:
    """MLX's mlx.nn.GRU / mlx.nn.LSTM; training is mx.value_and_grad of sum(y * dy) with
    respect to the layer's parameters and the input.

    The layouts, from ml-explore/mlx python/mlx/nn/layers/recurrent.py (read at commits
    b3f1de78 and 06f93d13): GRU ``Wx`` [3H, I], ``Wh`` [3H, H], gate blocks r, z, n,
    ``b`` [3H] added to the input projection (outside r), ``bhn`` [H] added to the
    recurrent n block inside r, ``h = (1 - z) * n + z * h_prev``; LSTM ``Wx`` [4H, I],
    ``Wh`` [4H, H], one ``bias`` [4H], blocks i, f, g, o. So the contract's PyTorch
    mapping applies: b = [b_ir + b_hr, b_iz + b_hz, b_in], bhn = b_hn; bias = b_ih + b_hh.
    The file at 06f93d13 stores the weights transposed, [I, G*H] and [H, G*H]
    (``x @ Wx``); MLX 0.32 has the b3f1de78 layout. `transposed` asks the installed
    version which it is. Inputs are batch-major [N, T, I].
    """

    def __init__(self, stream):
        import mlx.core as mx
        import mlx.nn as nn

        self.mx, self.nn = mx, nn
        mx.set_default_device(mx.gpu if stream == "gpu" else mx.cpu)
        self.where = stream
        self.label = f"mlx ({stream})"

    def transposed(self, kind):
        """Whether this MLX stores Wx as [I, G*H] instead of [G*H, I] (a layer whose two
        sizes differ tells)."""
        layer = self.layer_class(kind)(1, 2)
        return tuple(layer.Wx.shape)[0] == 1

    def layer_class(self, kind):
        return self.nn.GRU if kind == "gru" else self.nn.LSTM

    def layer(self, kind, params):
        """An MLX layer holding `params` (PyTorch's layout), in their dtype."""
        mx = self.mx
        weight_ih, weight_hh = params["weight_ih"], params["weight_hh"]
        b_ih, b_hh = params["bias_ih"], params["bias_hh"]
        H = weight_hh.shape[1]
        values = {"Wx": weight_ih, "Wh": weight_hh}
        if kind == "gru":
            values["b"] = np.concatenate([b_ih[: 2 * H] + b_hh[: 2 * H], b_ih[2 * H :]])
            values["bhn"] = b_hh[2 * H :]
        else:
            values["bias"] = b_ih + b_hh
        if self.transposed(kind):
            values["Wx"], values["Wh"] = weight_ih.T, weight_hh.T
        layer = self.layer_class(kind)(weight_ih.shape[1], H)
        layer.update({k: mx.array(np.ascontiguousarray(v)) for k, v in values.items()})
        return layer

    def prepare(self, problem, mode):
        mx, c = self.mx, problem.config
        layer = self.layer(c.kind, problem.params)
        x = mx.array(np.ascontiguousarray(problem.x.transpose(1, 0, 2)))  # [N, T, I]

        def forward(x):
            out = layer(x)
            return out[0] if isinstance(out, tuple) else out  # the LSTM's (hidden, cell)

        if mode == "inference":

            def run():
                y = forward(x)
                mx.eval(y)
                return y

            return run, _no_sync, lambda y: {"y": np.array(y.astype(mx.float32)).transpose(1, 0, 2)}

        dy = mx.array(np.ascontiguousarray(problem.dy.astype(np.float32).transpose(1, 0, 2)))

        def loss(params, x):
            layer.update(params)
            return (forward(x).astype(mx.float32) * dy).sum()

        grad = mx.value_and_grad(loss, argnums=(0, 1))
        params = layer.trainable_parameters()
        transposed = self.transposed(c.kind)

        def run():
            value, (dparams, dx) = grad(params, x)
            mx.eval(value, dparams, dx)
            return dparams, dx

        def result(out):
            dparams, dx = out
            g = {k: np.array(v.astype(mx.float32)) for k, v in dparams.items()}
            d_ih, d_hh = (g["Wx"].T, g["Wh"].T) if transposed else (g["Wx"], g["Wh"])
            if c.kind == "gru":
                bias_hh = np.zeros_like(g["b"])
                bias_hh[2 * c.H :] = g["bhn"]
                grads = {"weight_ih": d_ih, "weight_hh": d_hh, "bias_ih": g["b"]}
                grads["bias_hh"] = bias_hh
            else:
                grads = {"weight_ih": d_ih, "weight_hh": d_hh, "bias_ih": g["bias"]}
                grads["bias_hh"] = g["bias"]
            r = canonical_gradients(c.kind, grads)
            r["dx"] = np.array(dx.astype(mx.float32)).transpose(1, 0, 2)
            return r

        return run, _no_sync, result


# Where the peers run for each rnncore device: (torch device, MLX stream).
PEER_DEVICES = {"metal": ("mps", "gpu"), "cpu": ("cpu", "cpu"), "metal-emulated": ("cpu", "cpu")}


def _version(module):
    from importlib import metadata

    try:
        return metadata.version(module)
    except metadata.PackageNotFoundError:
        return "?"


def make_peers(device):
    """The peers for `device`: a list of (name, implementation or None, version or None,
    why it is missing or None)."""
    torch_device, mlx_stream = PEER_DEVICES.get(device, ("cpu", "cpu"))
    peers = []

    if importlib.util.find_spec("torch") is None:
        peers.append(("torch", None, None, "torch not installed"))
    else:
        try:
            import torch

            if torch_device == "mps" and not torch.backends.mps.is_available():
                peers.append(("torch", None, torch.__version__, "torch has no MPS device"))
            else:
                peers.append(("torch", TorchImpl(torch_device), torch.__version__, None))
        except Exception as e:  # noqa: BLE001 (a broken install is reported, not fatal)
            peers.append(("torch", None, None, f"torch import failed: {e}"))

    if importlib.util.find_spec("mlx") is None:
        peers.append(("mlx", None, None, "mlx not installed"))
    else:
        try:
            import mlx.core as mx

            version = _version("mlx")
            if mlx_stream == "gpu" and not mx.metal.is_available():
                peers.append(("mlx", None, version, "mlx has no Metal device"))
            else:
                peers.append(("mlx", MlxImpl(mlx_stream), version, None))
        except Exception as e:  # noqa: BLE001 (a broken install is reported, not fatal)
            peers.append(("mlx", None, None, f"mlx import failed: {e}"))
    return peers


# ---- measuring -------------------------------------------------------------------------------


@dataclass
class Timing:
    """How many runs: `warmup` untimed, then at least `min_runs` timed and more while
    `budget` seconds have not passed (at most `max_runs`)."""

    warmup: int
    min_runs: int
    max_runs: int
    budget: float


FULL_TIMING = Timing(warmup=3, min_runs=7, max_runs=100, budget=2.0)
QUICK_TIMING = Timing(warmup=1, min_runs=3, max_runs=20, budget=0.2)


def measure(run: Callable, sync: Callable, timing: Timing):
    """Times of `run` (seconds), each with the device synchronised before the clock stops."""
    for _ in range(timing.warmup):
        run()
        sync()
    times = []
    start = time.perf_counter()
    while len(times) < timing.min_runs or (
        len(times) < timing.max_runs and time.perf_counter() - start < timing.budget
    ):
        t0 = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - t0)
    return times


@dataclass
class Row:
    """One implementation on one configuration and mode.

    status: "timed" (rnncore), "ok" (a peer that agreed and was timed), "FAIL" (a peer
    that disagreed, or rnncore raising), "skipped" (missing peer, unsupported dtype or
    operation), "error" (a peer that raised: reported, not counted as a failure).
    """

    config: str
    mode: str
    impl: str
    status: str
    note: str = ""
    ms: Optional[float] = None
    times_ms: Optional[list] = None
    error: Optional[float] = None  # worst relative error vs rnncore
    field: Optional[str] = None  # where it was
    tolerance: Optional[float] = None
    ratio: Optional[float] = None  # rnncore's time / this one's


def _one_line(e):
    text = f"{type(e).__name__}: {e}".splitlines()[0]
    return text if len(text) <= 150 else text[:147] + "..."


def bench_rnncore(impl, problem, mode, timing):
    """rnncore's row and its results (None when it did not run)."""
    name = problem.config.name
    try:
        run, sync, result = impl.prepare(problem, mode)
        expected = result(run())
    except TypeError as e:
        if f"not {problem.config.dtype}" not in str(e):
            return Row(name, mode, impl.label, "FAIL", _one_line(e)), None
        # A dtype this device does not compute: "[gru] device 'cpu' computes ..., not float16".
        reason = str(e).split(";")[0].split("] ", 1)[-1]
        return Row(name, mode, impl.label, "skipped", f"rnncore: {reason}"), None
    except Exception as e:  # noqa: BLE001 (anything else from rnncore is a failure)
        return Row(name, mode, impl.label, "FAIL", _one_line(e)), None
    times = measure(run, sync, timing)
    ms = 1e3 * statistics.median(times)
    row = Row(name, mode, impl.label, "timed", f"{len(times)} runs", ms, [1e3 * t for t in times])
    return row, expected


def bench_peer(impl, problem, mode, expected, rnncore_ms, timing):
    """A peer's row: check it against rnncore's results, then (only if it agrees) time it."""
    c = problem.config
    tol = TOLERANCE[c.dtype]
    try:
        run, sync, result = impl.prepare(problem, mode)
        out = run()
        sync()
        actual = result(out)
    except Exception as e:  # noqa: BLE001 (a peer's own limits are reported, not fatal)
        return Row(c.name, mode, impl.label, "error", _one_line(e), tolerance=tol)
    err, field = worst_error(actual, expected)
    if not err <= tol:
        note = f"disagrees with rnncore: {field} relative error {err:.2e} > {tol:.0e}"
        return Row(c.name, mode, impl.label, "FAIL", note, error=err, field=field, tolerance=tol)
    times = measure(run, sync, timing)
    ms = 1e3 * statistics.median(times)
    return Row(
        c.name,
        mode,
        impl.label,
        "ok",
        f"{len(times)} runs",
        ms,
        [1e3 * t for t in times],
        err,
        field,
        tol,
        rnncore_ms / ms if rnncore_ms is not None and ms > 0 else None,
    )


# ---- output --------------------------------------------------------------------------------


def machine_name():
    """The processor (on macOS: the Apple chip, whose GPU "metal" runs on), best effort."""
    try:
        if sys.platform == "darwin":
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"],
                capture_output=True,
                text=True,
                timeout=5,
            )
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
        elif sys.platform.startswith("linux"):
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return platform.processor() or platform.machine() or "?"


def mlx_gpu_name():
    """The Metal device's name as MLX reports it, or None."""
    try:
        import mlx.core as mx

        info = mx.device_info(mx.gpu) if hasattr(mx, "device_info") else mx.metal.device_info()
        return info.get("device_name") or None
    except Exception:  # noqa: BLE001 (only a nicety for the header)
        return None


def print_table(config, rows):
    print(config.describe())
    header = ("mode", "implementation", "ms", "rnncore/peer", "check")
    table = [header]
    for r in rows:
        ms = f"{r.ms:.3f}" if r.ms is not None else "-"
        ratio = f"{r.ratio:.2f}" if r.ratio is not None else "-"
        if r.status == "ok":
            check = f"ok (err {r.error:.1e} <= {r.tolerance:.0e}; {r.note})"
        elif r.status == "timed":
            check = f"({r.note})"
        else:
            check = f"{r.status}: {r.note}" if r.status != "skipped" else r.note
        table.append((r.mode, r.impl, ms, ratio, check))
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        cells = [
            c.rjust(widths[i]) if i in (2, 3) else c.ljust(widths[i]) for i, c in enumerate(row)
        ]
        print("  " + "  ".join(cells).rstrip())
    print()


def run(args):
    """The bench subcommand: returns the exit status."""
    device = args.device or rnncore.devices()[0]
    if device not in rnncore.devices():
        print(
            f"device {device!r} is not available here (this build has: "
            f"{', '.join(rnncore.devices())})",
            file=sys.stderr,
        )
        return 2
    if args.quick:
        configs = EMULATED_QUICK if device == "metal-emulated" else QUICK
        timing = QUICK_TIMING
    else:
        configs, timing = CONFIGS, FULL_TIMING
    start = time.perf_counter()
    info = rnncore.build_info()
    peers = make_peers(device)
    machine = machine_name()
    gpu = mlx_gpu_name() if device == "metal" else None

    print(f"rnncore {rnncore.__version__} bench on device {device!r}: {machine}")
    if gpu:
        print(f"GPU: {gpu}")
    print(
        f"build: devices {', '.join(info.get('devices', []))}; CPU kernels "
        f"{info.get('kernels', '?')}; {info.get('threads', '?')} threads"
    )
    print(f"python {platform.python_version()}, numpy {np.__version__}")
    for name, impl, version, missing in peers:
        where = f" on {impl.where}" if impl is not None else ""
        print(f"{name}: {version or '-'}{where}" + (f" ({missing})" if missing else ""))
    if device == "metal-emulated":
        print("metal-emulated: the times measure the host emulator of the Metal kernels, not a GPU")
    print(
        f"time: median of {timing.min_runs}-{timing.max_runs} runs after {timing.warmup} "
        f"warm-up run(s); ratio = rnncore's time / the peer's (below 1: rnncore is faster)"
    )
    tolerances = ", ".join(f"{k} {v:.0e}" for k, v in TOLERANCE.items())
    print(f"check: worst relative error vs rnncore within {tolerances}")
    print()

    rows = []
    ours = RnncoreImpl(device)
    for config in configs:
        problem = make_problem(config)
        config_rows = []
        for mode in MODES:
            row, expected = bench_rnncore(ours, problem, mode, timing)
            config_rows.append(row)
            for name, impl, _, missing in peers:
                if impl is None:
                    config_rows.append(Row(config.name, mode, name, "skipped", missing))
                elif expected is None:
                    note = "rnncore did not run"
                    config_rows.append(Row(config.name, mode, impl.label, "skipped", note))
                else:
                    config_rows.append(bench_peer(impl, problem, mode, expected, row.ms, timing))
        print_table(config, config_rows)
        sys.stdout.flush()
        rows += config_rows

    failures = [r for r in rows if r.status == "FAIL"]
    errors = [r for r in rows if r.status == "error"]
    agreed = sum(r.status == "ok" for r in rows)
    elapsed = time.perf_counter() - start
    for r in failures:
        print(f"FAIL {r.config} {r.mode} {r.impl}: {r.note}")
    for r in errors:
        print(f"peer error (not counted as a failure) {r.config} {r.mode} {r.impl}: {r.note}")
    ok = not failures
    print(
        f"{'PASS' if ok else 'FAIL'}: {agreed} peer check(s) agreed with rnncore, "
        f"{len(failures)} failed, {len(errors)} peer error(s), in {elapsed:.1f} s"
    )

    if args.json:
        report = {
            "rnncore": rnncore.__version__,
            "device": device,
            "machine": machine,
            "gpu": gpu,
            "build_info": info,
            "python": platform.python_version(),
            "numpy": np.__version__,
            "peers": {
                name: {"version": version, "device": impl.label if impl else None, "missing": m}
                for name, impl, version, m in peers
            },
            "quick": bool(args.quick),
            "timing": asdict(timing),
            "tolerance": TOLERANCE,
            "configs": {c.name: asdict(c) for c in configs},
            "rows": [asdict(r) for r in rows],
            "passed": ok,
        }
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")
        print(f"wrote {args.json}")
    return 0 if ok else 1


def add_parser(sub):
    """Register ``bench`` on the command line's subparsers."""
    p = sub.add_parser(
        "bench",
        help="time rnncore against PyTorch and MLX on a device, after checking they agree",
        description="Check that PyTorch's nn.GRU / nn.LSTM (torch device 'mps' for --device "
        "metal, else 'cpu') and MLX's mlx.nn.GRU / mlx.nn.LSTM (gpu or cpu stream), each "
        "when installed, agree with rnncore on the same weights (inference: the output; "
        "training: the gradients of the input and every weight), then time them: median "
        "milliseconds and the ratio rnncore / peer. Exit status 1 if a check fails; "
        "missing peers are skipped. Times on metal-emulated measure the host emulator of "
        "the Metal kernels, not a GPU (use --quick there: tiny sizes; the full sizes take "
        "a long time).",
    )
    p.add_argument(
        "--device",
        metavar="NAME",
        help="the rnncore device: metal, cpu or metal-emulated (default: the best available, "
        "metal on a Mac)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="fewer runs, no N=128 H=1024 layers (tiny layers on metal-emulated)",
    )
    p.add_argument("--json", metavar="FILE", help="write every measurement to FILE as JSON")
    p.set_defaults(func=run)
    return p
