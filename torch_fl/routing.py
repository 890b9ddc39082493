"""Per-operator routing: which backend runs each operator on a flagos tensor.

Every operator without a basic flagos kernel goes through one router, which picks a backend per operator
overload (``aten::mm``, ``aten::add.Tensor``):

- ``native``: the accelerator's own kernel, zero-copy (CPU kernels on the simulated accelerator, CUDA on
  NVIDIA);
- ``cpu``: copy the inputs to the CPU, run there, copy the results back;
- ``flaggems``: FlagGems' Triton kernels (when FlagGems is usable in this process);
- ``python``: a Python callable registered with :func:`register_python_impl`.

Precedence, lowest first: the default chain (``native`` when the native device has a kernel for the op,
else ``cpu``) < the config file (``FLAGOS_BACKEND_CONFIG``, else ``torch_fl/configs/<accelerator>.conf``)
< ``FLAGOS_OP_<name>`` environment variables (``.`` written ``__``) < this module's API (:func:`set`, then
:func:`override` contexts on top). A backend that is unavailable for an op falls through (flaggems ->
native -> cpu, python -> native -> cpu, native -> cpu) with one warning per operator and backend.

Op names may omit ``aten::``; ``mm`` is the default overload ``aten::mm``. Backend names also accept the
existing plugin's spellings: ``cuda`` (native), ``flagos_python`` and ``flagos`` (flaggems).
See docs/routing.md.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping

from torch_fl import _C

__all__ = [
    "RoutingError",
    "backends",
    "get",
    "set",
    "override",
    "explain",
    "table",
    "reset",
    "load_config",
    "register_python_impl",
    "unregister_python_impl",
    "counts",
    "reset_counts",
    "replay_counts",
    "set_replay",
    "replay_enabled",
    "set_flaggems_fallback",
    "flaggems_fallback_enabled",
    "package_config",
]

_BACKENDS = ("native", "cpu", "flaggems", "python")
_CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
_ENV_PREFIX = "FLAGOS_OP_"


class RoutingError(ValueError):
    """A bad operator name, backend name, config file or FLAGOS_OP_* variable (the message says which,
    and for config files names the file and line)."""


def _call(fn, *args):
    try:
        return fn(*args)
    except ValueError as e:
        raise RoutingError(str(e)) from None


def _env_vars() -> list[tuple[str, str]]:
    return [(key, value) for key, value in os.environ.items() if key.startswith(_ENV_PREFIX)]


def _config_from_env() -> str:
    return os.environ.get("FLAGOS_BACKEND_CONFIG", "")


def backends() -> list[str]:
    """The backend names: ``['native', 'cpu', 'flaggems', 'python']``."""
    return list(_BACKENDS)


def get(op: str) -> str:
    """The backend that runs ``op`` now, after precedence and fall-through (warns once if its route's
    backend is unavailable)."""
    return _call(_C._routing_get, op)


def set(op: str, backend: str | None) -> None:
    """Routes ``op`` to ``backend`` at the API level (above config and env); ``None`` removes the
    API-level route so the lower levels apply again."""
    _call(_C._routing_set, op, backend)


@contextlib.contextmanager
def override(mapping: Mapping[str, str]) -> Iterator[None]:
    """Routes the ops of ``mapping`` (op -> backend) for the duration of the ``with`` block, above every
    other level.

    Overrides are global (every thread's ops follow them, as routing is a property of the process) and
    safe under concurrent use: each context is one entry in a shared stack that it removes on exit,
    whatever the order in which contexts of different threads exit. An op follows the most recently
    entered live context that names it; nested contexts restore the outer route on exit, also on an
    exception. The whole mapping is validated before anything changes.
    """
    token = _call(_C._routing_push_override, [(op, backend) for op, backend in dict(mapping).items()])
    try:
        yield
    finally:
        _C._routing_pop_override(token)


def explain(op: str) -> str:
    """The backend of ``op`` and the rule that chose it, e.g. ``'aten::mm -> cpu (env FLAGOS_OP_mm)'``,
    with fall-through steps, rules it shadows and a note when the op's calls do not (always) take that
    route: ops with a basic flagos kernel, composite ops no rule names (they run their composite kernel),
    CompositeImplicitAutograd ops while autograd records (they decompose)."""
    return _call(_C._routing_explain, op)


def table() -> dict[str, dict[str, str]]:
    """Every explicitly routed op: ``{'aten::mm': {'backend': ..., 'requested': ..., 'source': ...}}``,
    where ``backend`` is effective (after fall-through), ``requested`` what the winning rule asked for,
    and ``source`` that rule (``'config /path/x.conf:3'``, ``'env FLAGOS_OP_mm'``, ``'api'``,
    ``'override'``)."""
    return dict(_C._routing_table())


def reset(all: bool = False) -> None:
    """Drops every API-level route (:func:`set`, and the routes :func:`register_python_impl` made).
    With ``all=True`` also reloads the config file and the FLAGOS_OP_* variables from the current
    environment. Live :func:`override` contexts and registered Python implementations stay."""
    _C._routing_clear_api()
    if all:
        _call(_C._routing_load_config, _config_from_env())
        _call(_C._routing_load_env, _env_vars())


def load_config(path: str | os.PathLike | None) -> None:
    """Replaces the config level with the file at ``path`` (``None``: the default, i.e.
    ``FLAGOS_BACKEND_CONFIG`` or the package's config for the accelerator). On error nothing changes."""
    if path is None:
        path = _config_from_env()
    _call(_C._routing_load_config, os.fspath(path))


def register_python_impl(op: str, fn: Callable, *, route: bool = True) -> str:
    """Registers ``fn`` as the implementation of ``op`` for the ``python`` backend and, unless
    ``route=False``, routes ``op`` to ``python`` at the API level. ``fn`` receives the op's arguments
    with flagos tensors as native-device aliases (CPU on the simulated accelerator, CUDA on NVIDIA) and
    returns what the op's schema returns. Returns the op's canonical name."""
    if not callable(fn):
        raise TypeError(f"the Python implementation of {op} must be callable, got {type(fn).__name__}")
    name = _call(_C._routing_set_python_impl, op, fn)
    if route:
        set(name, "python")
    return name


def unregister_python_impl(op: str) -> None:
    """Removes the Python implementation of ``op``, and its API-level route if that is ``python``."""
    name = _call(_C._routing_set_python_impl, op, None)
    if _C._routing_api_route(name) == "python":
        set(name, None)


def counts() -> dict[str, int]:
    """Operator calls each backend served since the process started or the last :func:`reset_counts`:
    ``{'native': ..., 'cpu': ..., 'flaggems': ..., 'python': ...}``. A call is counted once, under the
    backend that ran it (after fall-through; a flaggems call that FlagGems failed and the native route
    ran again counts as native), when the router hands it over; ops with a basic flagos
    kernel (factories, views, copies) and ops that run a composite kernel (which calls routed ops, counted
    themselves) are not router calls. Counts are process-wide (summed over threads): exact for calls that
    have returned. How the ``flaggems`` calls ran (replayed, recorded, in Python) is :func:`replay_counts`."""
    return dict(_C._routing_counts())


def reset_counts() -> None:
    """Sets every backend's :func:`counts` and the :func:`replay_counts` to zero."""
    _C._routing_reset_counts()


def replay_counts() -> dict:
    """How the flaggems backend's calls ran since the process started or the last :func:`reset_counts`:
    ``replayed`` (from a recorded launch plan, without Python), ``recorded`` (in Python while the recorder
    watched: a signature's first calls), ``python`` (in Python, not replayable), ``refused`` (reason ->
    calls it kept in Python) and ``ops`` (op -> its counts, its signatures and how many are armed, and
    whether its signature cache is full). See docs/flaggems.md."""
    return _C._replay_counts()


def set_replay(enabled: bool) -> None:
    """Turns the replay of recorded FlagGems launches on or off for the process (``FLAGOS_FLAGGEMS_REPLAY=0``
    turns it off from the start). Off, every flaggems call runs FlagGems' Python wrapper."""
    _C._replay_set_enabled(bool(enabled))


def replay_enabled() -> bool:
    return bool(_C._replay_enabled())


def set_flaggems_fallback(enabled: bool) -> None:
    """Whether a call FlagGems fails (an exception from its Python code) runs again on the native route, for
    functional ops that draw no random numbers, with one warning per op naming the error; on by default,
    ``FLAGOS_FLAGGEMS_FALLBACK=0`` turns it off from the start. Off, FlagGems' exception reaches the caller.
    Where the native route fails as well, its error is the one raised."""
    _C._flaggems_set_fallback(bool(enabled))


def flaggems_fallback_enabled() -> bool:
    return bool(_C._flaggems_fallback_enabled())


def package_config(name: str) -> str:
    """The path of one of the package's configs, e.g. ``package_config("flaggems_cuda")`` for
    ``torch_fl/configs/flaggems_cuda.conf`` (for ``load_config`` or ``FLAGOS_BACKEND_CONFIG``)."""
    path = os.path.join(_CONFIG_DIR, name if name.endswith(".conf") else f"{name}.conf")
    if not os.path.isfile(path):
        known = sorted(f.removesuffix(".conf") for f in os.listdir(_CONFIG_DIR) if f.endswith(".conf"))
        raise RoutingError(f"no package config {name!r} (known: {', '.join(known)})")
    return path


def _set_flaggems_available(available: bool, reason: str = "set by a test") -> None:
    """For tests: decides whether the flaggems backend is usable, without loading FlagGems (an op is
    routable to flaggems only where it also has a FlagGems implementation, see torch_fl._flaggems)."""
    _C._routing_set_flaggems_available(bool(available), reason)


def _init() -> None:
    # FLAGOS_BACKEND_CONFIG and FLAGOS_OP_* are validated here, so that a typo fails `import torch_fl`
    # with the variable's or file's name rather than at some later operator. The package default config
    # is loaded at the first routed op: choosing the accelerator must not happen at import.
    _call(_C._routing_init, _CONFIG_DIR, _config_from_env(), _env_vars())


_init()
