"""The lengths section (``--lengths``): GRU and LSTM over batches of sequences of different
lengths, float32, inference and training (forward, then the gradients of the input and of
every weight for dL/dy = dy), side by side: rnncore with ``sequence_lengths``, rnncore on the
padded batch without them, PyTorch's ``pack_padded_sequence`` through ``nn.GRU`` /
``nn.LSTM``, and ONNX Runtime with ``sequence_lens`` (inference). Every implementation is
checked against rnncore's float64 result with lengths (itself tested against PyTorch's
packed sequences) before it is timed.

Targets (docs/api.md, "Sequences of different lengths"): rnncore with lengths within 1.15×
of (sum of lengths / N·T) × its padded time, and at most 0.5× PyTorch's packed time."""

from __future__ import annotations

import numpy as np

from .. import convert
from .peers import Config, Problem

SIZE = (200, 64, 256)  # T, N, I = H
QUICK_SIZE = (40, 16, 64)
TOL = 1e-4


def cases(T, N):  # noqa: N803
    """(name, lengths): lengths uniform in [1, T], and one row of T among short ones."""
    rng = np.random.default_rng(14)
    uniform = rng.integers(1, T + 1, N)
    one_long = rng.integers(1, max(2, T // 20) + 1, N)
    one_long[N // 2] = T
    return [("uniform in [1, T]", uniform), ("one of T, the rest <= T/20", one_long)]


class Case:
    """One layer, its data and lengths, and the float64 reference."""

    def __init__(self, kind, T, N, H, lengths):  # noqa: N803
        import rnncore

        self.rc = rnncore
        self.kind, self.lengths = kind, np.asarray(lengths, np.int64)
        self.problem = Problem(Config(kind, T, N, H))
        c = self.problem.config
        self.T, self.N, self.H = c.T, c.N, c.H
        self.weights = self.problem.rnncore_weights()
        self.x, self.dy = self.problem.x, self.problem.dy
        valid = np.arange(T)[:, None] < self.lengths[None, :]
        self.dy = np.where(valid[:, :, None], self.dy, 0).astype(np.float32)
        self.reference = self._rnncore(np.float64, self.lengths)

    def _rnncore(self, dtype, lengths, training=True):
        rc, kind = self.rc, self.kind
        x = self.x.astype(dtype)
        w = {k: v.astype(dtype) for k, v in self.weights.items()}
        desc = self.problem.descriptor(training)
        fwd = getattr(rc, kind)(x, sequence_lengths=lengths, descriptor=desc, **w)
        if not training:
            return {"y": fwd.state}
        rest = dict(w)
        R = rest.pop("recurrent_weight")  # noqa: N806
        extra = (fwd.state,) if kind == "gru" else (fwd.cell,)
        g = getattr(rc, kind + "_gradients")(
            x, R, self.dy.astype(dtype), fwd.z_state, *extra,
            sequence_lengths=lengths, descriptor=desc, **rest,
        )  # fmt: skip
        return {"y": fwd.state, "dx": g.source}

    def fraction(self):
        return float(self.lengths.sum()) / (self.T * self.N)

    def implementations(self, mode):
        """(name, run, result) per available implementation."""
        training = mode == "training"
        impls = []
        for name, lengths in (("rnncore, lengths", self.lengths), ("rnncore, padded", None)):

            def run(lengths=lengths):
                return self._rnncore(np.float32, lengths, training)

            impls.append((name, run, run if lengths is not None else None))
        try:
            impls.append(("PyTorch, packed", *self._torch(training)))
        except ImportError:
            pass
        if not training:
            try:
                impls.append(("ONNX Runtime, sequence_lens", *self._ort()))
            except ImportError:
                pass
        return impls

    def _torch(self, training):
        import torch
        from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

        module = getattr(torch.nn, self.kind.upper())(self.H, self.H)
        module.load_state_dict(
            {k: torch.from_numpy(v) for k, v in self.problem.torch_state_dict().items()}
        )
        lengths = torch.from_numpy(self.lengths)
        dy = torch.from_numpy(self.dy)

        def run():
            x = torch.from_numpy(self.x).requires_grad_(training)
            with torch.set_grad_enabled(training):
                packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
                out, _ = module(packed)
                y, _ = pad_packed_sequence(out, total_length=self.T)
                if not training:
                    return {"y": y}
                module.zero_grad(set_to_none=True)
                (y * dy).sum().backward()
                return {"y": y.detach(), "dx": x.grad}

        def result():
            return {k: v.detach().numpy() for k, v in run().items()}

        return run, result

    def _ort(self):
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper

        W, R, B = convert.onnx_weights_from_torch(self.kind, self.problem.torch_params)  # noqa: N806
        attrs = {"hidden_size": self.H}
        if self.kind == "gru":
            attrs["linear_before_reset"] = 1
        node = helper.make_node(self.kind.upper(), ["X", "W", "R", "B", "L"], ["Y"], **attrs)
        graph = helper.make_graph(
            [node],
            "lengths",
            [
                helper.make_tensor_value_info("X", TensorProto.FLOAT, list(self.x.shape)),
                helper.make_tensor_value_info("L", TensorProto.INT32, [self.N]),
            ],
            [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
            initializer=[numpy_helper.from_array(a, n) for n, a in (("W", W), ("R", R), ("B", B))],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
        model.ir_version = 8
        options = ort.SessionOptions()
        options.inter_op_num_threads = 1
        options.log_severity_level = 4
        session = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        feed = {"X": self.x, "L": self.lengths.astype(np.int32)}

        def run():
            return session.run(None, feed)

        def result():
            Y = run()[0]  # noqa: N806
            return {"y": Y.reshape(self.T, self.N, self.H)}

        return run, result

    def check(self, result):
        """Largest relative error of the result against the float64 reference."""
        errors = []
        for k, v in result().items():
            ref = self.reference[k]
            errors.append(float(np.max(np.abs(v - ref)) / max(np.max(np.abs(ref)), 1e-30)))
        return max(errors)


def run_lengths(quick, measure, timing, allowed, rounds=None):
    """Rows (case, kind, mode, implementation, seconds, note) of the lengths section. Each
    implementation is timed in `rounds` alternating rounds (3; 1 with quick): a time is the
    median over the rounds, a ratio the median of the rounds' ratios, so that a machine
    whose speed drifts during the run moves both sides of a ratio alike."""
    T, N, H = QUICK_SIZE if quick else SIZE  # noqa: N806
    rounds = rounds or (1 if quick else 3)
    rows = []
    for case_name, lengths in cases(T, N):
        for kind in ("gru", "lstm"):
            case = Case(kind, T, N, H, lengths)
            for mode in ("inference", "training"):
                impls = []
                for name, run, result in case.implementations(mode):
                    err = case.check(result) if result is not None else 0.0
                    if err > TOL:
                        rows.append((case_name, kind, mode, name, None, f"FAILED check {err:.1e}"))
                    else:
                        impls.append((name, run))
                times = {name: [] for name, _ in impls}
                for _ in range(rounds):
                    for name, run in impls:
                        times[name].append(measure(run, timing, allowed)["median_s"])
                ours = times.get("rnncore, lengths")
                padded = times.get("rnncore, padded")
                for name, ts in times.items():
                    note = ""
                    if name == "rnncore, lengths" and padded:
                        f = case.fraction()
                        ratio = np.median([a / (f * b) for a, b in zip(ts, padded)])
                        note = f"{ratio:.2f} of (sum L / N·T = {f:.2f}) × padded"
                    elif name not in ("rnncore, lengths", "rnncore, padded") and ours:
                        ratio = np.median([a / b for a, b in zip(ours, ts)])
                        note = f"rnncore with lengths takes {ratio:.2f} of this"
                    rows.append((case_name, kind, mode, name, float(np.median(ts)), note))
    return rows, (T, N, H)


def table(rows, size):
    T, N, H = size  # noqa: N806
    lines = [f"variable lengths: T={T} N={N} I=H={H} float32", ""]
    for case_name, kind, mode, name, seconds, note in rows:
        ms = "" if seconds is None else f"{seconds * 1e3:9.2f} ms"
        lines.append(f"  {case_name:28} {kind.upper():4} {mode:9} {name:28} {ms:12}  {note}")
    return "\n".join(lines)
