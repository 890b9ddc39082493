"""Opt-in compatibility layers: code written for another device running on flagos unchanged.

CUDA (``import torch_fl.compat.cuda``, or :func:`enable_cuda`): on a machine whose accelerator is not NVIDIA
(the simulated one, another vendor's), ``device="cuda"``/``"cuda:N"``, ``.cuda()`` and the ``torch.cuda``
device, stream, event, memory and RNG calls resolve to flagos. Never on by default, refused where real CUDA
exists, undone by :func:`disable_cuda`. ``torch.cuda.is_available()`` and ``torch.version.cuda`` keep
answering for CUDA (False and None here): docs/compat.md lists what changes and what platform checks see.

Jiterator (:func:`enable_jiterator`): with flagos backed by CUDA, functions made by
``torch.cuda.jiterator._create_jit_fn`` take flagos tensors and return flagos tensors (torch launches them
outside the dispatcher, on the inputs' device, which must otherwise be a CUDA one).

This is the one place torch_fl replaces attributes of torch; everything else uses torch's registration APIs.
"""

from __future__ import annotations

from torch_fl.compat import _cuda, _jiterator


def enable_cuda() -> None:
    """Makes CUDA-written code run on flagos (idempotent). Raises where real CUDA devices exist, or when no
    flagos device is available. Enable it before importing the code that uses CUDA: names bound earlier with
    ``from torch import zeros`` keep torch's functions."""
    _cuda.enable()


def disable_cuda() -> None:
    """Undoes :func:`enable_cuda`: every attribute of torch it changed is restored (idempotent)."""
    _cuda.disable()


def is_cuda_enabled() -> bool:
    return _cuda.enabled()


def enable_jiterator() -> None:
    """Lets ``torch.cuda.jiterator`` functions run on flagos tensors (idempotent). Raises unless flagos is
    backed by CUDA. It wraps one function of ``torch._C``, the jiterator's launch; :func:`disable_jiterator`
    puts torch's back."""
    _jiterator.enable()


def disable_jiterator() -> None:
    """Undoes :func:`enable_jiterator` (idempotent)."""
    _jiterator.disable()


def is_jiterator_enabled() -> bool:
    return _jiterator.enabled()


__all__ = [
    "disable_cuda",
    "disable_jiterator",
    "enable_cuda",
    "enable_jiterator",
    "is_cuda_enabled",
    "is_jiterator_enabled",
]
