"""One attribute of torch replaced while a compatibility layer is on, and put back when it goes off: what the
opt-in layers of :mod:`torch_fl.compat` that wrap a single function share."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class AttributeWrap:
    """``owner().name`` replaced by ``wrap(original)`` between :meth:`enable` and :meth:`disable`.
    ``check()`` runs first and raises where the layer cannot work; ``what`` names the layer in errors."""

    def __init__(
        self, what: str, owner: Callable[[], Any], name: str, wrap: Callable, check: Callable[[], None]
    ):
        self._what, self._owner, self._name, self._wrap, self._check = what, owner, name, wrap, check
        self._lock = threading.Lock()
        self._original = None

    def enabled(self) -> bool:
        return self._original is not None

    def enable(self) -> None:
        with self._lock:
            if self._original is not None:
                return
            self._check()
            owner = self._owner()
            original = getattr(owner, self._name, None)
            if original is None:
                raise RuntimeError(
                    f"{self._what}: this torch has no {getattr(owner, '__name__', owner)}.{self._name} to adapt "
                    "(built without it, or its entry point changed)"
                )
            setattr(owner, self._name, self._wrap(original))
            self._original = original

    def disable(self) -> None:
        with self._lock:
            if self._original is None:
                return
            setattr(self._owner(), self._name, self._original)
            self._original = None
