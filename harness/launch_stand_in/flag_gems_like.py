"""A FlagGems-shaped kernel library for the simulated accelerator: wrappers written the way FlagGems writes
them (allocate, compute a grid, launch Triton-shaped kernels, triton_like.py), each made to exercise one
thing the launch recorder and replay engine must handle. Served as the flaggems backend by :func:`install`.

Replayable: ``add.Tensor`` (pointers, an fp32 alpha, an i32 size); ``mul.Tensor`` (an i64 size; a 0-dim
operand read on the host: replayed when it is a CPU scalar, whose value is in the signature, refused when
it is flagos memory); ``add_.Tensor`` (in place: the result is an argument); ``clamp`` (fp64, u32 and
u64 arguments); ``lerp.Scalar`` (fp16, u1 and i16 arguments); ``leaky_relu`` (bf16, i1 and i64 arguments); ``cat``
(copies made through ATen: a dtype conversion, a contiguous copy of a strided input); ``sum`` (a ``reshape`` that copies a strided input; fills made with ``full``, ``zero_``
and, in ``cat``, ``zeros``); ``_softmax`` (two launches and a scratch buffer between them); ``fill_.Scalar`` (an fp32
value); ``sub.Tensor`` (which "autotunes": its first call of a signature launches three candidate
kernels, later calls one).

Refused, one per reason: ``neg`` (reads device data on the host), ``abs`` (runs an ATen op inside),
``sin`` (a pointer to memory it keeps between calls), ``cos`` (launches differ on every call),
``uniform_`` (a random op, whose simulated generator keeps no Philox offset), ``mm`` (an ATen op inside;
its out= overload, served by an adapter of ``mm``, refuses with it). ``add.out`` is served by an adapter
of ``add.Tensor``: replayed, with the route's copy into out.
"""

from __future__ import annotations

import itertools

import torch

from harness.launch_stand_in import triton_like

__version__ = "5.0.2+launch-stand-in"
_torch_fl_triton = triton_like  # the launcher torch_fl's recorder watches

BLOCK = 64

_ADD = triton_like.jit(
    "add_kernel",
    """
typedef struct { const float* x; const float* y; float* out; float alpha; int32_t n; void* s0; void* s1; } P;
void add_kernel(const ctx_t* c, const void* raw) {
  const P* p = (const P*)raw;
  int64_t first = (int64_t)c->program_id[0] * BLOCK;
  for (int64_t i = first; i < first + BLOCK && i < p->n; ++i) p->out[i] = p->x[i] + p->alpha * p->y[i];
}
""",
    ["x", "y", "out", "alpha", "n", "BLOCK"],
    constexprs=["BLOCK"],
)

_MUL = triton_like.jit(
    "mul_kernel",
    """
typedef struct { const float* x; const float* y; float* out; int64_t n; void* s0; void* s1; } P;
void mul_kernel(const ctx_t* c, const void* raw) {
  const P* p = (const P*)raw;
  int64_t first = (int64_t)c->program_id[0] * BLOCK;
  for (int64_t i = first; i < first + BLOCK && i < p->n; ++i) p->out[i] = p->x[i] * p->y[i];
}
""",
    ["x", "y", "out", "n", "BLOCK"],
    constexprs=["BLOCK"],
    types={"n": "i64"},
)

_SCALE = triton_like.jit(
    "scale_kernel",
    """
typedef struct { const float* x; float* out; float factor; int32_t n; void* s0; void* s1; } P;
void scale_kernel(const ctx_t* c, const void* raw) {
  const P* p = (const P*)raw;
  int64_t first = (int64_t)c->program_id[0] * BLOCK;
  for (int64_t i = first; i < first + BLOCK && i < p->n; ++i) p->out[i] = p->x[i] * p->factor;
}
""",
    ["x", "out", "factor", "n", "BLOCK"],
    constexprs=["BLOCK"],
)

_CLAMP = triton_like.jit(
    "clamp_kernel",
    """
typedef struct { const float* x; float* out; double lo; double hi; uint32_t which; uint64_t n; void* s0; void* s1; } P;
void clamp_kernel(const ctx_t* c, const void* raw) {
  const P* p = (const P*)raw;
  uint64_t first = (uint64_t)c->program_id[0] * BLOCK;
  for (uint64_t i = first; i < first + BLOCK && i < p->n; ++i) {
    float v = p->x[i];
    if ((p->which & 1u) && v < p->lo) v = (float)p->lo;
    if ((p->which & 2u) && v > p->hi) v = (float)p->hi;
    p->out[i] = v;
  }
}
""",
    ["x", "out", "lo", "hi", "which", "n", "BLOCK"],
    constexprs=["BLOCK"],
    types={"lo": "fp64", "hi": "fp64", "which": "u32", "n": "u64"},
)

_ROW_MAX = triton_like.jit(
    "row_max_kernel",
    """
typedef struct { const float* x; float* row_max; int32_t cols; void* s0; void* s1; } P;
void row_max_kernel(const ctx_t* c, const void* raw) {
  const P* p = (const P*)raw;
  const float* row = p->x + (int64_t)c->program_id[0] * p->cols;
  float m = row[0];
  for (int32_t j = 1; j < p->cols; ++j) m = row[j] > m ? row[j] : m;
  p->row_max[c->program_id[0]] = m;
}
""",
    ["x", "row_max", "cols"],
)

_SOFTMAX_ROWS = triton_like.jit(
    "softmax_rows_kernel",
    """
#include <math.h>
typedef struct { const float* x; const float* row_max; float* out; int32_t cols; void* s0; void* s1; } P;
void softmax_rows_kernel(const ctx_t* c, const void* raw) {
  const P* p = (const P*)raw;
  int64_t r = c->program_id[0];
  const float* row = p->x + r * p->cols;
  float* out = p->out + r * p->cols;
  float sum = 0;
  for (int32_t j = 0; j < p->cols; ++j) { out[j] = expf(row[j] - p->row_max[r]); sum += out[j]; }
  for (int32_t j = 0; j < p->cols; ++j) out[j] /= sum;
}
""",
    ["x", "row_max", "out", "cols"],
)

_FILL = triton_like.jit(
    "fill_kernel",
    """
typedef struct { float* out; float value; int32_t n; void* s0; void* s1; } P;
void fill_kernel(const ctx_t* c, const void* raw) {
  const P* p = (const P*)raw;
  int64_t first = (int64_t)c->program_id[0] * BLOCK;
  for (int64_t i = first; i < first + BLOCK && i < p->n; ++i) p->out[i] = p->value;
}
""",
    ["out", "value", "n", "BLOCK"],
    constexprs=["BLOCK"],
)

# Half-precision and boolean arguments, packed as Triton's launcher packs them: fp16 and bf16 as their
# two-byte bit patterns, a boolean as one byte.
_HALF_TO_FLOAT = """
static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, exponent = (h >> 10) & 31u, mantissa = h & 1023u, bits;
  if (exponent == 0 && mantissa == 0) {
    bits = sign;
  } else if (exponent == 0) {
    int shift = 0;
    while (!(mantissa & 1024u)) { mantissa <<= 1; ++shift; }
    bits = sign | ((uint32_t)(113 - shift) << 23) | ((mantissa & 1023u) << 13);
  } else if (exponent == 31) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}
static float bfloat16_to_float(uint16_t b) {
  uint32_t bits = (uint32_t)b << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}
"""

_LERP = triton_like.jit(
    "lerp_kernel",
    _HALF_TO_FLOAT
    + """
typedef struct {
  const float* x; const float* end; float* out; uint16_t weight; uint8_t from_end; int16_t n; void* s0; void* s1;
} P;
void lerp_kernel(const ctx_t* c, const void* raw) {
  const P* p = (const P*)raw;
  float w = half_to_float(p->weight);
  int64_t first = (int64_t)c->program_id[0] * BLOCK;
  for (int64_t i = first; i < first + BLOCK && i < p->n; ++i) {
    float d = p->end[i] - p->x[i];
    p->out[i] = p->from_end ? p->end[i] - d * (1.0f - w) : p->x[i] + w * d;
  }
}
""",
    ["x", "end", "out", "weight", "from_end", "n", "BLOCK"],
    constexprs=["BLOCK"],
    types={"weight": "fp16", "n": "i16"},
)

_LEAKY_RELU = triton_like.jit(
    "leaky_relu_kernel",
    _HALF_TO_FLOAT
    + """
typedef struct { const float* x; float* out; uint16_t slope; int8_t negate; int64_t n; void* s0; void* s1; } P;
void leaky_relu_kernel(const ctx_t* c, const void* raw) {
  const P* p = (const P*)raw;
  float slope = bfloat16_to_float(p->slope) * (p->negate ? -1.0f : 1.0f);
  int64_t first = (int64_t)c->program_id[0] * BLOCK;
  for (int64_t i = first; i < first + BLOCK && i < p->n; ++i) p->out[i] = p->x[i] > 0 ? p->x[i] : p->x[i] * slope;
}
""",
    ["x", "out", "slope", "negate", "n", "BLOCK"],
    constexprs=["BLOCK"],
    types={"slope": "bf16", "negate": "i1", "n": "i64"},
)

_CAT_COPY = triton_like.jit(
    "cat_copy_kernel",
    """
typedef struct {
  float* out; const float* in; int64_t dim_in; int64_t dim_out; int64_t post; int64_t offset; int64_t n;
  void* s0; void* s1;
} P;
void cat_copy_kernel(const ctx_t* c, const void* raw) {
  const P* p = (const P*)raw;
  int64_t first = (int64_t)c->program_id[0] * BLOCK;
  for (int64_t i = first; i < first + BLOCK && i < p->n; ++i) {
    int64_t pre = i / (p->dim_in * p->post), d = (i / p->post) % p->dim_in, post = i % p->post;
    p->out[(pre * p->dim_out + d + p->offset) * p->post + post] = p->in[i];
  }
}
""",
    ["out", "in_", "dim_in", "dim_out", "post", "offset", "n", "BLOCK"],
    constexprs=["BLOCK"],
    types={"dim_in": "i64", "dim_out": "i64", "post": "i64", "offset": "i64", "n": "i64"},
)

_SUM_ALL = triton_like.jit(
    "sum_all_kernel",
    """
typedef struct { const float* x; float* out; int64_t n; void* s0; void* s1; } P;
void sum_all_kernel(const ctx_t* c, const void* raw) {
  const P* p = (const P*)raw;
  float total = 0;
  for (int64_t i = 0; i < p->n; ++i) total += p->x[i];
  *p->out += total;  /* accumulates into memory the wrapper filled */
}
""",
    ["x", "out", "n"],
    types={"n": "i64"},
)


def _grid(n: int) -> tuple[int]:
    return ((n + BLOCK - 1) // BLOCK,)


def _flat_float(*tensors: torch.Tensor) -> bool:
    return all(t.dtype == torch.float32 and t.is_contiguous() for t in tensors)


def _wait_for_kernels() -> None:
    # On the simulated accelerator the Python path hands wrappers CPU aliases of flagos memory, so a copy
    # a wrapper makes through ATen (``contiguous``, ``to``, ``reshape``) lives in CPU memory, freed when
    # the wrapper lets go of it: the kernels that read it run on the stream's worker, so the wrapper waits
    # for them first. (On a GPU those copies are device memory, freed in stream order.)
    torch.flagos.current_stream().synchronize()


def _empty_like(x: torch.Tensor) -> torch.Tensor:
    # The simulated accelerator's kernels run on its stream worker: their memory is flagos memory, handed
    # out in stream order by flagos's caching allocator, as a real vendor's wrapper allocates on its device.
    return torch.empty(x.shape, dtype=x.dtype, device=torch.device("flagos", torch.flagos.current_device()))


def add(x, y, *, alpha=1):
    if not (_flat_float(x, y) and x.shape == y.shape):
        return torch.add(x, y, alpha=alpha)  # outside what the kernel takes: an ATen op (refused)
    out = _empty_like(x)
    _ADD[_grid(x.numel())](x, y, out, float(alpha), x.numel(), BLOCK)
    return out


def add_(x, y, *, alpha=1):
    _ADD[_grid(x.numel())](x, y, x, float(alpha), x.numel(), BLOCK)
    return x


def mul(x, y):
    out = _empty_like(x)
    if y.dim() == 0:  # a scalar operand, read on the host as FlagGems does
        _SCALE[_grid(x.numel())](x, out, float(y.item()), x.numel(), BLOCK)
        return out
    _MUL[_grid(x.numel())](x, y, out, x.numel(), BLOCK)
    return out


def clamp(x, min=None, max=None):  # noqa: A002  (ATen's argument names)
    out = _empty_like(x)
    which = (min is not None) | ((max is not None) << 1)
    lo, hi = float(min or 0.0), float(max or 0.0)
    _CLAMP[_grid(x.numel())](x, out, lo, hi, which, x.numel(), BLOCK)
    return out


def lerp(x, end, weight):
    out = _empty_like(x)
    w = float(weight)
    _LERP[_grid(x.numel())](x, end, out, w, w >= 0.5, x.numel(), BLOCK)  # a bool: which end to start from
    return out


def leaky_relu(x, negative_slope=0.01):
    out = _empty_like(x)
    slope = float(negative_slope)
    _LEAKY_RELU[_grid(x.numel())](x, out, -slope if slope < 0 else slope, slope < 0, x.numel(), BLOCK)
    return out


def cat(tensors, dim=0):
    """FlagGems' cat: promotes with ``.to``, makes each input contiguous (a copy of a strided one), then
    copies each into place with a kernel."""
    tensors = list(tensors)
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    if dtype != torch.float32:
        return torch.cat(tensors, dim)  # outside what the kernel takes: an ATen op (refused)
    tensors = [t.to(dtype) for t in tensors]
    dim %= tensors[0].dim()
    shape = list(tensors[0].shape)
    shape[dim] = sum(t.shape[dim] for t in tensors)
    out = torch.zeros(shape, dtype=dtype, device=tensors[0].device)
    post = 1
    for size in shape[dim + 1 :]:
        post *= size
    offset = 0
    pieces = [t.contiguous() for t in tensors]
    for t in pieces:
        _CAT_COPY[_grid(t.numel())](out, t, t.shape[dim], shape[dim], post, offset, t.numel(), BLOCK)
        offset += t.shape[dim]
    _wait_for_kernels()
    return out


def sum_(x, *, dtype=None):
    """Flattens with ``reshape`` (a copy when the input is strided) and reduces with one program into
    memory made by ``full`` (zeroed again with ``zero_``)."""
    flat = x.reshape(-1)
    out = torch.full([], 7.0, dtype=x.dtype, device=x.device)
    out.zero_()
    _SUM_ALL[(1,)](flat, out, flat.numel())
    _wait_for_kernels()
    return out


def softmax(x, dim, half_to_float=False):
    rows, cols = x.numel() // x.shape[-1], x.shape[-1]
    row_max = torch.empty(
        rows, dtype=torch.float32, device=torch.device("flagos", torch.flagos.current_device())
    )
    out = _empty_like(x)
    _ROW_MAX[(rows,)](x, row_max, cols)
    _SOFTMAX_ROWS[(rows,)](x, row_max, out, cols)
    return out


def fill_(x, value):
    _FILL[_grid(x.numel())](x, float(value), x.numel(), BLOCK)
    return x


_tuned: set = set()


def sub(x, y, *, alpha=1):
    out = _empty_like(x)
    key = (tuple(x.shape), x.dtype)
    if key not in _tuned:  # an autotuner's first call: every candidate runs, then the best is kept
        _tuned.add(key)
        for _ in range(3):
            _ADD[_grid(x.numel())](x, y, out, -float(alpha), x.numel(), BLOCK)
        return out
    _ADD[_grid(x.numel())](x, y, out, -float(alpha), x.numel(), BLOCK)
    return out


def neg(x):
    out = _empty_like(x)
    if x.view(-1)[0].item() != 0:  # reads device data on the host
        _FILL[_grid(x.numel())](out, 0.0, x.numel(), BLOCK)
    _ADD[_grid(x.numel())](out, x, out, -1.0, x.numel(), BLOCK)
    return out


def abs(x):  # noqa: A001
    return torch.where(x < 0, -x, x)


_kept: dict = {}


def sin(x):
    buffer = _kept.setdefault(x.numel(), _empty_like(x))  # memory the library keeps between calls
    _FILL[_grid(x.numel())](buffer, 0.0, x.numel(), BLOCK)
    out = _empty_like(x)
    _ADD[_grid(x.numel())](buffer, x, out, 1.0, x.numel(), BLOCK)
    return out


_counter = itertools.count()


def cos(x):
    out = _empty_like(x)
    _FILL[_grid(x.numel())](out, float(next(_counter)), x.numel(), BLOCK)  # a value that changes per call
    return out


def uniform_(x, from_=0.0, to=1.0, *, generator=None):
    _FILL[_grid(x.numel())](x, float(from_), x.numel(), BLOCK)
    return x


def mm(a, b):
    return torch.mm(a, b)


_CONFIG = (
    ("add.Tensor", add),
    ("add_.Tensor", add_),
    ("mul.Tensor", mul),
    ("_softmax", softmax),
    ("clamp", clamp),
    ("lerp.Scalar", lerp),
    ("leaky_relu", leaky_relu),
    ("cat", cat),
    ("sum", sum_),
    ("fill_.Scalar", fill_),
    ("sub.Tensor", sub),
    ("neg", neg),
    ("abs", abs),
    ("sin", sin),
    ("cos", cos),
    ("uniform_", uniform_),
    ("mm", mm),
)


def enable(lib=None, unused=None, registrar=None, record=False, once=False, path=None):
    """FlagGems' protocol: hands the (aten op key, function) table to `registrar`."""
    registrar(_CONFIG, user_include_ops=[], user_exclude_ops=list(unused or []), cpp_patched_ops=[], lib=lib)


def install() -> None:
    """Serves this library as the flaggems backend of this process (the simulated accelerator)."""
    from torch_fl import _flaggems

    status = _flaggems._install(__import__(__name__, fromlist=["enable"]))
    if not status.available:
        raise RuntimeError(f"the launch stand-in is unavailable: {status.reason}")
