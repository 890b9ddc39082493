"""Stand-in for flag_gems 5.0.2 (see ../README.md): its registrar protocol, CPU functions that record calls."""

import os

import torch
import triton  # noqa: F401  (the real flag_gems imports triton at load)

if os.environ.get("FAKE_FLAGGEMS_IMPORT_LOG"):
    with open(os.environ["FAKE_FLAGGEMS_IMPORT_LOG"], "a") as _log:
        _log.write("flag_gems\n")
if os.environ.get("FAKE_FLAGGEMS_IMPORT_ERROR") == "1":
    raise RuntimeError(
        "No device were detected on your machine ! \n Please check that your driver is complete. "
    )

__version__ = "5.0.2+fake"
CALLS = []  # names of the functions called, in order


def _recorded(name, fn):
    def wrapper(*args, **kwargs):
        CALLS.append(name)
        if os.environ.get("FAKE_FLAGGEMS_CRASH") == name:
            os._exit(3)  # a kernel that takes the process down
        if os.environ.get("FAKE_FLAGGEMS_WRONG") == name:
            return fn(*args, **kwargs) * 1.01  # a kernel with wrong results
        return fn(*args, **kwargs)

    wrapper.__name__ = name
    return wrapper


add = _recorded("add", lambda self, other, *, alpha=1: torch.add(self, other, alpha=alpha))
add_ = _recorded("add_", lambda self, other, *, alpha=1: self.add_(other, alpha=alpha))
mm = _recorded("mm", lambda self, mat2: torch.mm(self, mat2))
mm_out = _recorded("mm_out", lambda self, mat2, *, out: torch.mm(self, mat2, out=out))
softmax = _recorded(
    "softmax", lambda self, dim, half_to_float=False: torch._softmax(self, dim, half_to_float)
)
max_dim = _recorded("max_dim", lambda self, dim, keepdim=False: tuple(torch.max(self, dim, keepdim)))
index_select = _recorded("index_select", lambda self, dim, index: torch.index_select(self, dim, index))
to_copy = _recorded("to_copy", lambda self, **kwargs: self.clone())
abs = _recorded("abs", lambda self: torch.abs(self))  # noqa: A001
neg = _recorded("neg", lambda self: torch.neg(self))
sin = _recorded("sin", lambda self: torch.sin(self))
future_op = _recorded("future_op", lambda self: self)

_FULL_CONFIG = (
    ("add.Tensor", add),
    ("add_.Tensor", add_),
    ("mm", mm),
    ("mm.out", mm_out),
    ("_softmax", softmax),
    ("max.dim", max_dim),
    ("index_select", index_select),
    ("_to_copy", to_copy, lambda: True),
    ("abs", abs, lambda: False),  # a condition that is false (FlagGems: a torch version check)
    ("neg", neg),  # patched by the C++ extension (cpp_patched_ops)
    ("sin", sin),  # excluded by name (user_exclude_ops)
    ("op_of_a_future_torch", future_op),  # not an operator of this torch
)
if os.environ.get("FAKE_FLAGGEMS_CAPTURE_OPS") == "1":
    # Ops whose FlagGems implementations cannot run inside a CUDA graph capture: a random op (FlagGems reads
    # the generator's state on the host) and masked_fill_ (FlagGems' synchronises), which the router runs
    # natively inside one when backed, and equal (a host bool: never capturable, on cuda either).
    rand = _recorded(
        "rand",
        lambda size, *, dtype=None, layout=None, device=None, pin_memory=None: torch.rand(
            size, dtype=dtype, device=device
        ),
    )
    masked_fill_ = _recorded("masked_fill_", lambda self, mask, value: self.masked_fill_(mask, value))
    equal = _recorded("equal", lambda self, other: torch.equal(self, other))
    _FULL_CONFIG += (("rand", rand), ("masked_fill_.Scalar", masked_fill_), ("equal", equal))
aten_patch_list = ["neg"]


class Register:
    """FlagGems' own registrar: registers every entry into `lib` (a torch.library.Library)."""

    def __init__(
        self,
        config,
        user_include_ops=None,
        user_exclude_ops=None,
        cpp_patched_ops=None,
        lib=None,
        full_config_by_func=None,
    ):
        self.lib = lib
        self.registered = []
        for item in config:
            key, fn = item[0], item[1]
            if len(item) > 2 and not item[2]():
                continue
            try:
                if self.lib is None:
                    raise ValueError("Library instance is not provided.")
                self.lib.impl(key, fn, "CPU")
                self.registered.append(key)
            except Exception:  # noqa: BLE001  (FlagGems logs and skips)
                pass


registrar = Register
current_work_registrar = None
_PROTOCOL = os.environ.get("FAKE_FLAGGEMS_PROTOCOL", "")

if _PROTOCOL == "no_registrar":

    def enable(lib=None, unused=None, record=False, once=False, path=None):
        global current_work_registrar
        current_work_registrar = Register(_FULL_CONFIG, user_exclude_ops=unused or [], lib=lib)

else:

    def enable(lib=None, unused=None, registrar=registrar, record=False, once=False, path=None):
        global current_work_registrar
        if _PROTOCOL == "ignores_registrar":
            registrar = Register
        exclude_ops = list(unused) if isinstance(unused, (list, tuple, set)) else []
        current_work_registrar = registrar(
            _FULL_CONFIG,
            user_include_ops=[],
            user_exclude_ops=exclude_ops + ["sin"],
            cpp_patched_ops=list(set(aten_patch_list)),
            lib=lib,
        )
