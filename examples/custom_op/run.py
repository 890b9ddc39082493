"""Builds the example just in time (torch_fl.utils.cpp_extension.load) and runs both operators on flagos
tensors, checked against the CPU:

    python examples/custom_op/run.py [--build-dir DIR]
"""

from __future__ import annotations

import argparse
import os

import torch

import torch_fl
from torch_fl.utils import cpp_extension

HERE = os.path.dirname(os.path.abspath(__file__))


def build(build_dir: str | None):
    sources = [os.path.join(HERE, "my_ops.cpp")]
    if torch.version.cuda:
        sources.append(os.path.join(HERE, "my_ops_cuda.cu"))
    if build_dir:
        os.makedirs(build_dir, exist_ok=True)
    return cpp_extension.load("flagos_custom_ops", sources, build_directory=build_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--build-dir", help="where to build (default: torch's extension cache)")
    args = parser.parse_args()
    module = build(args.build_dir)
    print(
        f"flagos/extension.h API version {module.flagos_api_version()}, accelerator {torch_fl.accelerator()}"
    )

    x = torch.randn(4, 1000)
    bias = torch.randn(1000)

    # 1. Registered for the native device only: runs on flagos through the native route.
    out = torch.ops.custom_ops.scaled_tanh(x.to("flagos"), 0.5)
    torch.testing.assert_close(out.cpu(), 0.5 * torch.tanh(x))
    print(
        "custom_ops::scaled_tanh on flagos:",
        out.device,
        "-",
        torch_fl.routing.explain("custom_ops::scaled_tanh"),
    )

    # 2. Registered for flagos: its own kernel, ahead of routing.
    out = torch.ops.custom_ops.bias_relu(x.to("flagos"), bias.to("flagos"))
    torch.testing.assert_close(out.cpu(), (x + bias).clamp_min(0))
    print("custom_ops::bias_relu on flagos:", out.device, "(flagos's own kernel)")
    print("OK")


if __name__ == "__main__":
    main()
