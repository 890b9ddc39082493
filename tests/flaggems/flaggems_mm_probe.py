"""Does FlagGems' mm (or mm.out) compute one product right, called directly on CUDA tensors, without torch_fl's
route? For telling FlagGems' own defects from the route's: the sweep (tools/flaggems_sweep.py) saw
`aten::mm.out` kill its worker with an illegal memory access; this runs the same kind of call with no
flagos tensor anywhere. One case per process, since a fault poisons the CUDA context:

    python tests/flaggems/flaggems_mm_probe.py --overload mm --shape 5,0,10 --dtype float32

The function is the one torch_fl's flaggems route calls for the overload (torch_fl._flaggems.implementation);
the tensors are plain CUDA tensors. Prints `RESULT {"result": "ok" | "mismatch", ...}` and exits 0, or dies
with FlagGems' error (exit status 1). FlagGems' Hopper mm autotunes over up to 216 Triton configs per new
shape (minutes on a cold Triton cache), so each of FlagGems' autotuned kernels is cut to its first config
here; --all-configs keeps FlagGems' autotuning.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch


def first_config_only() -> int:
    """Cuts every autotuned Triton kernel of the loaded flag_gems modules to its first config (a diagnostic:
    a fault does not depend on which config runs first). Returns how many kernels it cut."""
    import triton

    cut = 0
    for name, module in list(sys.modules.items()):
        if not name.startswith("flag_gems") or module is None:
            continue
        for value in list(vars(module).values()):
            obj, depth = value, 0
            while obj is not None and depth < 4 and not isinstance(obj, triton.runtime.Autotuner):
                obj, depth = getattr(obj, "fn", None), depth + 1
            if isinstance(obj, triton.runtime.Autotuner) and len(obj.configs) > 1:
                obj.configs = obj.configs[:1]
                cut += 1
    return cut


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--overload", choices=("mm", "mm.out"), default="mm")
    parser.add_argument("--shape", default="5,0,10", help="M,K,N of (M, K) @ (K, N) (default 5,0,10)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    parser.add_argument("--all-configs", action="store_true", help="keep FlagGems' autotuning")
    args = parser.parse_args(argv)
    from torch_fl import _flaggems

    status = _flaggems.load()
    if not status.available:
        print(f"flaggems_mm_probe: FlagGems is unavailable: {status.reason}", file=sys.stderr)
        return 2
    fn = _flaggems.implementation(f"aten::{args.overload}")
    cut = 0 if args.all_configs else first_config_only()
    m, k, n = (int(x) for x in args.shape.split(","))
    dtype = getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=g).to(dtype).cuda()
    b = torch.randn(k, n, generator=g).to(dtype).cuda()
    expected = a @ b
    if args.overload == "mm":
        got = fn(a, b)
    else:
        got = fn(a, b, out=torch.empty(m, n, dtype=dtype, device="cuda"))
    torch.cuda.synchronize()
    close = torch.allclose(got.float(), expected.float(), rtol=2e-2, atol=2e-2)
    print(
        "RESULT " + json.dumps({"result": "ok" if close else "mismatch", "kernels_cut_to_one_config": cut}),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
