"""Benchmark rnncore against PyTorch, ONNX Runtime, MLX (if installed) and a numpy loop.

    python bench/run.py [--quick] [--device NAME] [--threads 1 2] [--configs NAME ...]
                        [--modes inference training] [--out DIR] [--json FILE] [--force]
                        [--loaded [--rounds K]]

The same bench as ``python -m rnncore bench`` (rnncore.bench, where every option is
described); run from a checkout, it records the checkout's commit. The committed results in
bench/results/ were made with ``--threads 2 --out DIR --force`` on an AMD EPYC (Zen 3; those in
bench/results/intel-xeon-amx/ on an Intel Xeon with AMX, bench/results/intel-xeon-busy/ on a
busy one, and in bench/results/amd-zen2/ on a
Zen 2 with an earlier build), loaded.md with ``--loaded``; replacing files takes ``--force``.
"""

import sys
from pathlib import Path

from rnncore.bench import main

if __name__ == "__main__":
    sys.exit(main(checkout=Path(__file__).resolve().parent))
