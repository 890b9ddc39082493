"""Builds the example as a package: pip install --no-build-isolation examples/custom_op (torch and torch_fl
installed first). The CUDA source is added when torch has CUDA."""

import torch
from setuptools import setup

from torch_fl.utils.cpp_extension import BuildExtension, FlagosExtension

sources = ["my_ops.cpp"] + (["my_ops_cuda.cu"] if torch.version.cuda else [])

setup(
    name="flagos_custom_ops",
    version="0.1",
    ext_modules=[FlagosExtension("flagos_custom_ops", sources)],
    cmdclass={"build_ext": BuildExtension},
)
