"""Opt-in compatibility layers: code written for another device running on flagos unchanged.

CUDA (``import torch_fl.compat.cuda``, or :func:`enable_cuda`): on a machine whose accelerator is not NVIDIA
(the simulated one, another vendor's), ``device="cuda"``/``"cuda:N"``, ``.cuda()`` and the ``torch.cuda``
device, stream, event, memory and RNG calls resolve to flagos. Never on by default, refused where real CUDA
exists, undone by :func:`disable_cuda`. ``torch.cuda.is_available()`` and ``torch.version.cuda`` keep
answering for CUDA (False and None here): docs/ecosystem.md ("CUDA-written code") lists what changes and what platform checks see.

Jiterator (:func:`enable_jiterator`): with flagos backed by CUDA, functions made by
``torch.cuda.jiterator._create_jit_fn`` take flagos tensors and return flagos tensors (torch launches them
outside the dispatcher, on the inputs' device, which must otherwise be a CUDA one).

FlexAttention (:func:`enable_flex_attention`): ``flex_attention`` accepts flagos tensors (torch checks a
fixed list of device types before dispatching).

This is the one place torch_fl replaces attributes of torch; everything else uses torch's registration APIs.
"""

from __future__ import annotations

from torch_fl.compat import _cuda, _flex_attention, _jiterator


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
    _jiterator.layer.enable()


def disable_jiterator() -> None:
    """Undoes :func:`enable_jiterator` (idempotent)."""
    _jiterator.layer.disable()


def is_jiterator_enabled() -> bool:
    return _jiterator.layer.enabled()


def enable_flex_attention() -> None:
    """Lets ``torch.nn.attention.flex_attention.flex_attention`` take flagos tensors (idempotent): it wraps
    torch's device check, ``_validate_device``; :func:`disable_flex_attention` puts torch's back. Eagerly it
    runs everywhere; compiled, it needs flagos backed by a GPU with Triton."""
    _flex_attention.layer.enable()


def disable_flex_attention() -> None:
    """Undoes :func:`enable_flex_attention` (idempotent)."""
    _flex_attention.layer.disable()


def is_flex_attention_enabled() -> bool:
    return _flex_attention.layer.enabled()


__all__ = [
    "disable_cuda",
    "disable_flex_attention",
    "disable_jiterator",
    "enable_cuda",
    "enable_flex_attention",
    "enable_jiterator",
    "is_cuda_enabled",
    "is_flex_attention_enabled",
    "is_jiterator_enabled",
]
