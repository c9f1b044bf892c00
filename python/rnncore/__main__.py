"""Command line: ``python -m rnncore demo | info | check | bench | cost``.

``demo`` trains a GRU and an LSTM with rnncore's gradients (demo.py), ``info`` prints
what this build is (version, devices, BLAS library, compiler), ``check`` compares every
operation with the numpy reference (check.py) and ``bench`` times rnncore against its
peers (the rnncore.bench package).
"""

import argparse
import platform
import sys

import numpy as np

import rnncore
from rnncore import bench, check
from rnncore.bench import cost


def info(args):
    build = rnncore.build_info()
    lines = [
        ("version", build.get("version", rnncore.__version__)),
        ("devices", ", ".join(build.get("devices", rnncore.devices()))),
        ("BLAS", build.get("blas", "?")),
        ("compiler", build.get("compiler", "?")),
    ]
    known = {"version", "devices", "blas", "compiler"}
    lines += [(k, str(v)) for k, v in build.items() if k not in known]
    lines += [
        ("python", f"{platform.python_version()} ({sys.executable})"),
        ("numpy", np.__version__),
        ("location", rnncore.__file__),
    ]
    width = max(len(k) for k, _ in lines)
    print(f"rnncore {build.get('version', rnncore.__version__)}")
    for k, v in lines:
        print(f"  {k.ljust(width)}  {v}")
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["demo"]:  # the demo parses its own options
        from . import demo

        return demo.main(argv[1:])
    parser = argparse.ArgumentParser(
        prog="python -m rnncore",
        description="rnncore: a training demo, build information, self-check and benchmark.",
    )
    sub = parser.add_subparsers(dest="command", metavar="command")
    sub.required = True
    sub.add_parser(
        "demo",
        help="train a GRU and an LSTM on the adding problem with rnncore's gradients "
        "(see python -m rnncore demo --help)",
    )
    sub.add_parser("info", help="print version, devices, BLAS and compiler").set_defaults(func=info)
    p_check = sub.add_parser("check", help=check.HELP, description=check.DESCRIPTION)
    check.add_arguments(p_check)
    p_check.set_defaults(func=check.run)
    bench.add_parser(sub)
    cost.add_parser(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
