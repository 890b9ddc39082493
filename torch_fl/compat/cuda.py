"""``import torch_fl.compat.cuda``: turns on torch_fl's CUDA compatibility (see :mod:`torch_fl.compat`).

Importing it again after :func:`torch_fl.compat.disable_cuda` does nothing (Python imports a module once):
call :func:`torch_fl.compat.enable_cuda` instead.
"""

from torch_fl.compat import enable_cuda

enable_cuda()
