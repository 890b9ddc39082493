"""The legacy typed storage classes of the flagos device (``torch.flagos.FloatStorage`` and the rest), as
``torch.cuda`` defines them for cuda.

torch finds a device's legacy storage classes by name in its device module: ``Tensor.storage_type()`` and
``TypedStorage._get_legacy_storage_class()`` return ``getattr(torch.<device>, "FloatStorage")``, and a
class answers for a device by the last component of its ``__module__``
(``torch.storage._get_device_from_module``): that decides what device ``torch.flagos.FloatStorage(4)``
allocates on and what ``isinstance(storage, torch.flagos.FloatStorage)`` checks. So the classes are made
here but belong to the device module ``torch.flagos`` (``torch_fl.flagos`` re-exports them), as cuda's belong
to ``torch.cuda``: ``TypedStorage.type()`` names them ``torch.flagos.FloatStorage`` as tensors' types are
named ``torch.flagos.FloatTensor``, and pickle finds them there in a process that imported torch_fl. Their
instances are plain ``TypedStorage`` objects, as on cuda.
"""

from __future__ import annotations

import torch
from torch._utils import classproperty
from torch.storage import _LegacyStorage, _warn_typed_storage_removal

_DEVICE_MODULE = "torch.flagos"


class _FlagosLegacyStorage(_LegacyStorage):
    """What the legacy classes of a device storage refuse, as torch.cuda's refuse it (they are host-only
    constructions)."""

    __module__ = _DEVICE_MODULE  # its device, for isinstance() checks against it

    @classmethod
    def from_buffer(cls, *args, **kwargs):
        _warn_typed_storage_removal()
        raise RuntimeError("from_buffer: Not available for flagos storage")

    @classmethod
    def _new_with_weak_ptr(cls, *args, **kwargs):
        raise RuntimeError("_new_with_weak_ptr: Not available for flagos storage")

    @classmethod
    def _new_shared_filename(cls, manager, obj, size, *, device=None, dtype=None):
        raise RuntimeError("_new_shared_filename: Not available for flagos storage")


def _storage_class(name: str, dtype: torch.dtype) -> type:
    def dtype_property(cls):
        _warn_typed_storage_removal()
        return cls._dtype

    return type(
        name,
        (_FlagosLegacyStorage,),
        {
            "__module__": _DEVICE_MODULE,
            "__qualname__": name,
            "__doc__": f"Legacy typed storage of {dtype} on the flagos device (a TypedStorage).",
            "dtype": classproperty(dtype_property),
            "_dtype": classproperty(lambda cls: dtype),
        },
    )


# The classes torch.cuda has (every legacy name but the quantized ones).
DoubleStorage = _storage_class("DoubleStorage", torch.double)
FloatStorage = _storage_class("FloatStorage", torch.float)
HalfStorage = _storage_class("HalfStorage", torch.half)
LongStorage = _storage_class("LongStorage", torch.long)
IntStorage = _storage_class("IntStorage", torch.int)
ShortStorage = _storage_class("ShortStorage", torch.int16)
CharStorage = _storage_class("CharStorage", torch.int8)
ByteStorage = _storage_class("ByteStorage", torch.uint8)
BoolStorage = _storage_class("BoolStorage", torch.bool)
BFloat16Storage = _storage_class("BFloat16Storage", torch.bfloat16)
ComplexDoubleStorage = _storage_class("ComplexDoubleStorage", torch.cdouble)
ComplexFloatStorage = _storage_class("ComplexFloatStorage", torch.cfloat)

STORAGE_CLASSES = (
    DoubleStorage,
    FloatStorage,
    HalfStorage,
    LongStorage,
    IntStorage,
    ShortStorage,
    CharStorage,
    ByteStorage,
    BoolStorage,
    BFloat16Storage,
    ComplexDoubleStorage,
    ComplexFloatStorage,
)

# torch's registry of storage classes, where torch.cuda enters its own: it makes the classes known to
# torch.load(weights_only=True) as safe globals.
torch._storage_classes.update(STORAGE_CLASSES)
