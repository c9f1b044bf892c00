"""Train a small GRU and a small LSTM on the adding problem with numpy and rnncore only.

Each sequence has two channels: random values in [0, 1) and a marker channel with two
1s, one in each half of the sequence. The target is the sum of the two marked values,
read from the last hidden state by a linear layer. A prediction is correct when it is
within 0.04 of the target; always predicting the mean scores about 8%.

The recurrent layer runs forward with ``descriptor.training = True`` and backward with
``rnncore.gru_gradients`` / ``rnncore.lstm_gradients``; the readout, the loss, gradient
clipping and Adam are a few lines of numpy. Run it as ``python -m rnncore demo``.

The full run (T = 100) passes when a model reaches 90% test accuracy. ``--quick``
(T = 20, 400 steps, under a second per model) passes when the test loss falls 50-fold;
predicting the mean only gets about 7-fold, so that needs the markers to be used.
"""

import argparse
import os
import sys
import time
from typing import Optional

import numpy as np
from tqdm import tqdm

import rnncore

TOLERANCE = 0.04  # a prediction within this of the target is correct
TARGET_ACCURACY = 0.90  # the full run passes at this test accuracy
QUICK_LOSS_FACTOR = 50.0  # --quick passes when the test loss fell by this factor
BATCH, HIDDEN, LEARNING_RATE, CLIP_NORM = 64, 32, 1e-2, 1.0
# (sequence length, training steps per epoch, default epochs): full run and --quick
FULL, QUICK = (100, 100, 30), (20, 100, 4)

# kind: (forward op, gradient op, descriptor class, gate blocks)
LAYERS = {
    "gru": (rnncore.gru, rnncore.gru_gradients, rnncore.GRUDescriptor, 3),
    "lstm": (rnncore.lstm, rnncore.lstm_gradients, rnncore.LSTMDescriptor, 4),
}


def adding_problem(rng, n, length):
    """n sequences [length, n, 2] (time-major, float32) and their targets [n]."""
    x = np.zeros((length, n, 2), np.float32)
    x[:, :, 0] = rng.random((length, n))
    cols = np.arange(n)
    first = rng.integers(0, length // 2, n)
    second = rng.integers(length // 2, length, n)
    x[first, cols, 1] = x[second, cols, 1] = 1.0
    return x, x[first, cols, 0] + x[second, cols, 0]


class Model:
    """One recurrent layer (rnncore) and a linear readout of its last state (numpy)."""

    def __init__(self, kind, rng, device, hidden=HIDDEN):
        self.forward_op, self.gradient_op, descriptor, gates = LAYERS[kind]
        self.kind, self.device = kind, device
        self.descriptor = descriptor(training=True)  # the forward also returns z_state
        scale = 1.0 / np.sqrt(hidden)

        def uniform(*shape):
            return rng.uniform(-scale, scale, shape).astype(np.float32)

        self.params = {
            "input_weight": uniform(gates * hidden, 2),
            "recurrent_weight": uniform(gates * hidden, hidden),
            "bias": np.zeros(gates * hidden, np.float32),
            "readout": uniform(hidden),
            "readout_bias": np.zeros(1, np.float32),
        }
        # Start out remembering: bias the LSTM forget gate (block 1 of i, f, z, o) and the
        # GRU update gate (block 0 of z, r, o; h = z * h_prev + (1 - z) * o) towards 1.
        block = 1 if kind == "lstm" else 0
        self.params["bias"][block * hidden : (block + 1) * hidden] = 1.0

    def run(self, x):
        """The layer's outputs and the readout's predictions [N]."""
        p = self.params
        out = self.forward_op(
            x,
            p["recurrent_weight"],
            p["input_weight"],
            p["bias"],
            descriptor=self.descriptor,
            device=self.device,
        )
        return out, out.state[-1] @ p["readout"] + p["readout_bias"]

    def loss_and_gradients(self, x, target):
        """Mean squared error and its gradient with respect to every parameter."""
        p = self.params
        out, pred = self.run(x)
        d_pred = (2.0 / len(target)) * (pred - target)
        grads = {"readout": out.state[-1].T @ d_pred, "readout_bias": d_pred.sum(keepdims=True)}
        # dL/dh for every step of the layer's output: only the last step feeds the readout.
        source_gradient = np.zeros_like(out.state)
        source_gradient[-1] = np.outer(d_pred, p["readout"])
        # Next to z_state the gradient ops take the forward's h (GRU) or c (LSTM).
        forward_output = out.state if self.kind == "gru" else out.cell
        g = self.gradient_op(
            x,
            p["recurrent_weight"],
            source_gradient,
            out.z_state,
            forward_output,
            input_weight=p["input_weight"],
            bias=p["bias"],
            descriptor=self.descriptor,
            device=self.device,
        )
        grads.update(recurrent_weight=g.recurrent_weight, input_weight=g.input_weight, bias=g.bias)
        return float(np.mean((pred - target) ** 2)), grads


class Adam:
    """Adam on a dict of float32 arrays, after clipping the gradients by global norm."""

    def __init__(self, params, lr=LEARNING_RATE, clip=CLIP_NORM, b1=0.9, b2=0.999, eps=1e-8):
        self.params, self.lr, self.clip = params, lr, clip
        self.b1, self.b2, self.eps = b1, b2, eps
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}
        self.t = 0

    def step(self, grads):
        norm = sum(float(np.sum(g * g)) for g in grads.values()) ** 0.5
        scale = min(1.0, self.clip / (norm + 1e-12))
        self.t += 1
        for k, g in grads.items():
            g = g * scale
            self.m[k] = self.b1 * self.m[k] + (1 - self.b1) * g
            self.v[k] = self.b2 * self.v[k] + (1 - self.b2) * g * g
            m_hat = self.m[k] / (1 - self.b1**self.t)
            v_hat = self.v[k] / (1 - self.b2**self.t)
            self.params[k] -= self.lr * m_hat / (np.sqrt(v_hat) + self.eps)


def evaluate(model, x, y):
    """(mean squared error, accuracy) on a test set."""
    pred = model.run(x)[1]
    return float(np.mean((pred - y) ** 2)), float(np.mean(np.abs(pred - y) < TOLERANCE))


def train(kind, args, device_name):
    """Train one model; returns (passed, summary line)."""
    name = kind.upper()
    rng = np.random.default_rng(args.seed)
    start = time.perf_counter()
    test_x, test_y = adding_problem(rng, 1000, args.length)
    model = Model(kind, rng, args.device)
    optimizer = Adam(model.params)
    first_loss, accuracy = evaluate(model, test_x, test_y)
    print(f"{name}: epoch 0  test loss {first_loss:.4f}  accuracy {accuracy:.1%}")
    for epoch in range(1, args.epochs + 1):
        # A bar on stderr while the epoch runs, only on a terminal (disable=None); the
        # line per epoch below is the output.
        steps = tqdm(range(args.steps), desc=f"  epoch {epoch}", leave=False, disable=None)
        for _ in steps:
            loss, grads = model.loss_and_gradients(*adding_problem(rng, BATCH, args.length))
            optimizer.step(grads)
            steps.set_postfix(loss=f"{loss:.4f}", refresh=False)
        loss, accuracy = evaluate(model, test_x, test_y)
        elapsed = time.perf_counter() - start
        print(
            f"{name}: epoch {epoch}  test loss {loss:.4f}  accuracy {accuracy:.1%}  "
            f"({elapsed:.1f} s)",
            flush=True,
        )
        if not args.quick and accuracy >= TARGET_ACCURACY:
            break
    if args.quick:
        passed = loss * QUICK_LOSS_FACTOR <= first_loss
        result = f"loss {first_loss:.3f} -> {loss:.4f} (target {QUICK_LOSS_FACTOR:g}x lower)"
    else:
        passed = accuracy >= TARGET_ACCURACY
        result = f"accuracy {accuracy:.1%} (target {TARGET_ACCURACY:.0%})"
    verdict = "PASS" if passed else "FAIL"
    return passed, f"{name}: {result} in {elapsed:.1f} s on {device_name} — {verdict}"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rnncore demo",
        description="Train a GRU and an LSTM on the adding problem with numpy and rnncore; "
        "exit status 0 when every model reaches its target.",
    )
    parser.add_argument(
        "--device",
        help=f"one of {', '.join(rnncore.devices())} (default: the best available)",
    )
    parser.add_argument("--model", choices=("gru", "lstm", "both"), default="both")
    parser.add_argument(
        "--epochs", type=int, help="at most this many epochs (default 30, or 4 with --quick)"
    )
    parser.add_argument("--steps", type=int, help="training steps per epoch (default 100)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--quick", action="store_true", help="a short run that checks learning")
    args = parser.parse_args(argv)
    if args.device is not None and args.device not in rnncore.devices():
        parser.error(
            f"device {args.device!r} is not available here (have: {', '.join(rnncore.devices())})"
        )
    if args.epochs is not None and args.epochs < 1:
        parser.error("--epochs must be at least 1")
    if args.steps is not None and args.steps < 1:
        parser.error("--steps must be at least 1")
    args.length, default_steps, default_epochs = QUICK if args.quick else FULL
    args.epochs = args.epochs or default_epochs
    args.steps = args.steps or default_steps
    # device=None means RNNCORE_DEVICE if set, else the best available device.
    device_name = args.device or os.environ.get("RNNCORE_DEVICE") or rnncore.devices()[0]
    kinds = ("gru", "lstm") if args.model == "both" else (args.model,)
    print(f"rnncore {rnncore.__version__} on {device_name}: adding problem, T={args.length}")
    results = [train(kind, args, device_name) for kind in kinds]
    print()
    for _, summary in results:
        print(summary)
    return 0 if all(passed for passed, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
