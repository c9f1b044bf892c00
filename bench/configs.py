"""The benchmark configurations: one recurrent layer each, input size I equal to hidden size H."""

from dataclasses import dataclass

GATES = {"rnn": 1, "lstm": 4, "gru": 3}


@dataclass(frozen=True)
class Config:
    kind: str  # "rnn" (tanh), "lstm" or "gru" (PyTorch's flavour: reset after, gates r, z, n)
    T: int
    N: int
    H: int
    bidirectional: bool = False
    dtype: str = "float32"

    @property
    def I(self):  # noqa: E743 (the contract's name for the input size)
        return self.H

    @property
    def D(self):
        return 2 if self.bidirectional else 1

    @property
    def G(self):
        return GATES[self.kind]

    @property
    def name(self):
        prefix = "bi" if self.bidirectional else ""
        suffix = "" if self.dtype == "float32" else "-f64"
        return f"{prefix}{self.kind}-T{self.T}-N{self.N}-H{self.H}{suffix}"

    def flops(self, mode):
        """Approximate floating-point operations: the GEMM work, 2·T·N·G·H·(I+H) per
        direction for the forward; training (forward + backward) counts three times that."""
        forward = 2 * self.D * self.T * self.N * self.G * self.H * (self.I + self.H)
        return forward if mode == "inference" else 3 * forward


CONFIGS = [
    Config("gru", 100, 1, 256),
    Config("lstm", 100, 1, 256),
    Config("gru", 100, 32, 256),
    Config("lstm", 100, 32, 256),
    Config("gru", 50, 128, 1024),
    Config("gru", 1000, 1, 64),
    Config("gru", 100, 32, 256, bidirectional=True),
    Config("lstm", 100, 32, 256, bidirectional=True),
    Config("gru", 100, 32, 256, dtype="float64"),
    Config("rnn", 100, 32, 256),
]
BY_NAME = {c.name: c for c in CONFIGS}

# The subset `--quick` runs when no --configs are given.
QUICK = [
    "gru-T100-N1-H256",
    "lstm-T100-N32-H256",
    "gru-T1000-N1-H64",
    "bigru-T100-N32-H256",
    "gru-T100-N32-H256-f64",
]
