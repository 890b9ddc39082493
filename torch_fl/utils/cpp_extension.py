"""Building C++ (and, with a CUDA build of torch, CUDA) extensions for flagos.

``torch.utils.cpp_extension`` plus torch_fl's public header and library: sources may include
``<flagos/extension.h>`` (current flagos stream, device guard, zero-copy views between flagos and the native
device, ``FLAGOS_LIBRARY_IMPL`` to register kernels for flagos) and are linked to ``libtorch_fl_core.so``,
torch_fl's core library (beside ``torch_fl._C``), which implements it.

- :func:`FlagosExtension`: a setuptools ``Extension`` (``CppExtension``, or ``CUDAExtension`` when a source is
  ``.cu``/``.cuh``), built with :class:`BuildExtension` (torch's).
- :func:`load` and :func:`load_inline`: torch's just-in-time builders with the same additions; ``load_inline``
  also puts ``#include <flagos/extension.h>`` at the top of the C++ sources.

A kernel registered for the native device (``TORCH_LIBRARY_IMPL(ns, CUDA, m)`` when flagos is backed by CUDA,
``CPU`` on the simulated accelerator) runs on flagos tensors through torch_fl's native route, unchanged; one
registered with ``FLAGOS_LIBRARY_IMPL`` (PrivateUse1) takes precedence over routing. ``examples/custom_op/``
shows both.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch
from torch.utils import cpp_extension as _torch_cpp_extension
from torch.utils.cpp_extension import BuildExtension  # noqa: F401  (re-exported: builds FlagosExtension)

__all__ = [
    "BuildExtension",
    "FlagosExtension",
    "include_paths",
    "library_paths",
    "load",
    "load_inline",
]

_HEADER = "#include <flagos/extension.h>"
_CUDA_SUFFIXES = (".cu", ".cuh")


def _package_dir() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


_CORE_LIBRARY = "torch_fl_core"


def _library() -> str:
    """Path of libtorch_fl_core.so, the library that implements flagos/extension.h: torch_fl's core, which
    torch_fl._C (beside it) links."""
    from torch_fl import _C

    return os.path.join(os.path.dirname(os.path.abspath(_C.__file__)), f"lib{_CORE_LIBRARY}.so")


def include_paths() -> list[str]:
    """Include directories of torch_fl's public headers (``flagos/extension.h``)."""
    return [os.path.join(_package_dir(), "include")]


def library_paths() -> list[str]:
    """Directories of the library extensions link to (libtorch_fl_core.so)."""
    return [os.path.dirname(_library())]


def _link_flags() -> list[str]:
    # Found through the rpath; at run time it is the library `import torch_fl` already loaded (the dynamic
    # loader matches its soname).
    directory = os.path.dirname(_library())
    return [f"-L{directory}", f"-l{_CORE_LIBRARY}", f"-Wl,-rpath,{directory}"]


def _check_cuda(what: str) -> None:
    if torch.version.cuda is None:
        raise RuntimeError(
            f"{what} need a CUDA build of torch, and this one ({torch.__version__}) has no CUDA: build C++ "
            "sources only (a kernel registered for the CPU runs on flagos tensors on the simulated accelerator)"
        )


def _with(values: Iterable[str] | None, extra: list[str]) -> list[str]:
    return list(values or []) + extra


def FlagosExtension(name: str, sources: list[str], *args, **kwargs):  # noqa: N802  (torch's naming)
    """A setuptools Extension for flagos: torch's ``CppExtension`` (``CUDAExtension`` when a source is CUDA)
    with torch_fl's include directory and library added. Build it with ``BuildExtension``::

        setup(name="my_ops", ext_modules=[FlagosExtension("my_ops", ["my_ops.cpp"])],
              cmdclass={"build_ext": BuildExtension})
    """
    cuda = any(str(source).endswith(_CUDA_SUFFIXES) for source in sources)
    if cuda:
        _check_cuda("CUDA sources")
    kwargs["include_dirs"] = _with(kwargs.get("include_dirs"), include_paths())
    kwargs["extra_link_args"] = _with(kwargs.get("extra_link_args"), _link_flags())
    builder = _torch_cpp_extension.CUDAExtension if cuda else _torch_cpp_extension.CppExtension
    return builder(name, sources, *args, **kwargs)


def load(name: str, sources, *args, extra_include_paths=None, extra_ldflags=None, **kwargs):
    """``torch.utils.cpp_extension.load`` with torch_fl's header and library (same arguments)."""
    import torch_fl  # noqa: F401  (the flagos device and torch_fl._C are loaded before the extension)

    sources = [sources] if isinstance(sources, str) else list(sources)
    if any(source.endswith(_CUDA_SUFFIXES) for source in sources):
        _check_cuda("CUDA sources")
    return _torch_cpp_extension.load(
        name,
        sources,
        *args,
        extra_include_paths=_with(extra_include_paths, include_paths()),
        extra_ldflags=_with(extra_ldflags, _link_flags()),
        **kwargs,
    )


def load_inline(
    name: str,
    cpp_sources,
    cuda_sources=None,
    *args,
    extra_include_paths=None,
    extra_ldflags=None,
    **kwargs,
):
    """``torch.utils.cpp_extension.load_inline`` with torch_fl's header (included at the top of the C++
    sources) and library (same arguments)."""
    import torch_fl  # noqa: F401

    cpp_sources = [cpp_sources] if isinstance(cpp_sources, str) else list(cpp_sources)
    if cuda_sources:
        _check_cuda("cuda_sources")
    return _torch_cpp_extension.load_inline(
        name,
        [_HEADER, *cpp_sources],
        cuda_sources,
        *args,
        extra_include_paths=_with(extra_include_paths, include_paths()),
        extra_ldflags=_with(extra_ldflags, _link_flags()),
        **kwargs,
    )
