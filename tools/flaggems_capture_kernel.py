"""A Triton kernel of the capture audit's own (tools/flaggems_capture_worker.py ``process_warmup``): its first
launch initialises Triton's driver and launcher in a worker before any FlagGems op runs. Imported only where
flagos is backed by CUDA and triton is the real one."""

import triton
import triton.language as tl


@triton.jit
def fill_kernel(out_ptr, n, value, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, value, mask=offsets < n)
