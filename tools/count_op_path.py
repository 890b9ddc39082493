"""Counts the project's functions one flagos op enters on the simulated accelerator.

For one op (default ``torch.add(a, b)`` on two 4-float flagos tensors), run after three warm-up calls of
the same op, it counts every entry into a function defined in the project's own sources (csrc/): the
entries, the distinct functions, the files (sources and headers apart), the entries per file and per layer,
the entries into runtime/hal_runtime.cpp and the calls of the HAL's ``flagos_get_device``.

Method: a Debug (-O0) build of the repository in a build folder of its own (``build/count-op-path``, the
targets ``_C`` and the sim HAL; the tool configures and builds it, incrementally after the first time),
loaded from a staged package beside that build, and gdb (/usr/bin/gdb). Between two signals the process
sends itself (after the warm-up, after the op), a breakpoint sits on the first instruction of every
function whose debug information places its definition under csrc/, and each hit is counted without
stopping (tools/count_op_path_gdb.py). -O0 keeps every function a call: what is inlined in the Release
build counts here, so the figures measure the shape of the path, not its time. Entries on threads other
than the caller's (the sim stream worker running the kernel) are counted too, and shown apart.

    python -m tools.count_op_path                          # build if needed, count torch.add(a, b)
    python -m tools.count_op_path --op "torch.mul(a, b)"   # another op (names: torch, a, b)
    python -m tools.count_op_path --order                  # also the entries in the order they happened
    python -m tools.count_op_path --no-build --json out.json

The first build takes about ten minutes on two cores (``--jobs`` sets the parallelism). The Python that
runs the tool is the one the build compiles against and the one that runs the op; torch_fl's Python files
come from this checkout (torch_fl/), its compiled parts from the Debug build, whatever torch_fl is
installed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GDB = "/usr/bin/gdb"
HAL_RUNTIME = "runtime/hal_runtime.cpp"
HAL_GET_DEVICE = "flagos_get_device"

# What the counted process runs: the staged package first on its path, site-packages after it, and no
# .pth files (python -S): an editable install of torch_fl elsewhere must not win over the staged one.
INFERIOR = r"""
import os, signal, site, sys
stage, op, warmups = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path[:0] = [stage]
sys.path.extend(site.getsitepackages())
import torch
import torch_fl
loaded = os.path.dirname(os.path.abspath(torch_fl._C.__file__))
if loaded != os.path.join(os.path.abspath(stage), "torch_fl"):
    sys.exit(f"count_op_path: torch_fl._C came from {loaded}, not from the staged Debug build in {stage}")
g = torch.Generator().manual_seed(0)
a = torch.randn(4, generator=g).to("flagos")
b = torch.randn(4, generator=g).to("flagos")
scope = {"torch": torch, "a": a, "b": b}
code = compile(op, "<op>", "eval")
for _ in range(warmups):
    eval(code, scope)
torch.flagos.synchronize()
os.kill(os.getpid(), signal.SIGUSR1)
result = eval(code, scope)
os.kill(os.getpid(), signal.SIGUSR1)
torch.flagos.synchronize()
expected = eval(code, {"torch": torch, "a": a.cpu(), "b": b.cpu()})
if not torch.equal(result.cpu(), expected):
    sys.exit("count_op_path: the op's flagos result differs from the CPU's")
"""


def build(build_dir: Path, jobs: int) -> None:
    """Configures (once) and builds the Debug targets the count needs."""
    if not (build_dir / "CMakeCache.txt").exists():
        subprocess.run(
            [
                "cmake",
                "-S",
                str(ROOT),
                "-B",
                str(build_dir),
                "-G",
                "Ninja",
                "-DCMAKE_BUILD_TYPE=Debug",
                f"-DPython3_EXECUTABLE={sys.executable}",
            ],
            check=True,
        )
    subprocess.run(
        ["cmake", "--build", str(build_dir), "-j", str(jobs), "--target", "_C", "flagos_hal_sim"],
        check=True,
    )


def built_libraries(build_dir: Path) -> dict[str, Path]:
    """The Debug build's extension module, core library and sim HAL; a clear error when one is missing."""
    found = {
        "_C": next(iter(sorted(build_dir.glob("_C.*.so"))), None),
        "core": build_dir / "libtorch_fl_core.so",
        "hal": build_dir / "csrc" / "hal" / "libflagos_hal_sim.so",
    }
    missing = [name for name, path in found.items() if path is None or not path.exists()]
    if missing:
        raise SystemExit(f"count_op_path: {build_dir} lacks {missing}: build it first (drop --no-build)")
    return found


def stage_package(build_dir: Path, extension: Path) -> Path:
    """A package folder whose torch_fl is this checkout's Python files plus the Debug extension module."""
    stage = build_dir / "stage"
    package = stage / "torch_fl"
    if package.exists():
        shutil.rmtree(package)
    package.mkdir(parents=True)
    for entry in (ROOT / "torch_fl").iterdir():
        if entry.name.startswith("_C.") or entry.name == "__pycache__":
            continue
        (package / entry.name).symlink_to(entry)
    (package / extension.name).symlink_to(extension)
    return stage


def count(build_dir: Path, op: str, warmups: int) -> dict:
    """Runs the op under gdb and returns the gdb side's record (functions with entries, entry order)."""
    if not Path(GDB).exists():
        raise SystemExit(f"count_op_path: needs gdb at {GDB}")
    libs = built_libraries(build_dir)
    stage = stage_package(build_dir, libs["_C"])
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "hits.json"
        inferior = Path(tmp) / "inferior.py"
        inferior.write_text(INFERIOR)
        env = dict(
            os.environ,
            FLAGOS_ACCELERATOR="sim",
            FLAGOS_HAL_DIR=str(libs["hal"].parent),
            COUNT_OP_PATH_SOURCES=str(ROOT / "csrc"),
            COUNT_OP_PATH_OUT=str(out),
            COUNT_OP_PATH_LIBS=":".join(str(p) for p in libs.values()),
        )
        gdb_script = ROOT / "tools" / "count_op_path_gdb.py"
        command = [GDB, "-batch", "-nx", "-iex", "set auto-load python-scripts off", "-x", str(gdb_script)]
        command += ["--args", sys.executable, "-S", str(inferior), str(stage), op, str(warmups)]
        proc = subprocess.run(command, env=env, capture_output=True, text=True)
        if proc.returncode != 0 or not out.exists():
            sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
            raise SystemExit(f"count_op_path: the counted run failed (gdb exit status {proc.returncode})")
        return json.loads(out.read_text())


def layer_of(file: str) -> str:
    """The layer of a csrc/-relative path: its first folder (hal, runtime, ops, python, ...)."""
    return file.split("/", 1)[0] if "/" in file else "(top)"


def summarize(record: dict) -> dict:
    """The figures of a gdb record: totals, sources and headers apart, per file, per layer, per function."""
    hit = [f for f in record["functions"] if f["entries"] > 0]
    per_file = Counter()
    per_layer = Counter()
    for f in hit:
        per_file[f["file"]] += f["entries"]
        per_layer[layer_of(f["file"])] += f["entries"]

    def part(functions):
        return {
            "entries": sum(f["entries"] for f in functions),
            "functions": len(functions),
            "files": len({f["file"] for f in functions}),
        }

    headers = [f for f in hit if f["file"].endswith((".h", ".hpp"))]
    sources = [f for f in hit if not f["file"].endswith((".h", ".hpp"))]
    functions = sorted(hit, key=lambda f: (-f["entries"], f["file"], f["name"]))
    layer_changes = 0
    previous = None
    for index, _ in record["order"]:
        layer = layer_of(record["functions"][index]["file"])
        layer_changes += previous is not None and layer != previous
        previous = layer
    return {
        "total": part(hit),
        "sources": part(sources),
        "headers": part(headers),
        "other_threads": sum(f["other_threads"] for f in hit),
        "hal_runtime_entries": per_file.get(HAL_RUNTIME, 0),
        "hal_get_device_calls": sum(f["entries"] for f in hit if f["name"] == HAL_GET_DEVICE),
        "layer_changes": layer_changes,
        "per_file": dict(per_file.most_common()),
        "per_layer": dict(per_layer.most_common()),
        "per_function": [
            {k: f[k] for k in ("name", "file", "line", "entries", "other_threads")} for f in functions
        ],
        "order": [
            {"name": record["functions"][i]["name"], "file": record["functions"][i]["file"], "caller": main}
            for i, main in record["order"]
        ],
    }


def short_name(name: str, width: int = 90) -> str:
    """A demangled name without its parameter list ({anon} for an anonymous namespace), cut to `width`."""
    name = name.replace("(anonymous namespace)", "{anon}")
    cut = name.find("(")
    name = name[:cut] if cut > 0 else name
    return name if len(name) <= width else name[: width - 3] + "..."


def report(op: str, summary: dict, show_order: bool) -> str:
    t, s, h = summary["total"], summary["sources"], summary["headers"]
    lines = [
        f"op: {op}  (simulated accelerator, Debug -O0 build, after warm-up)",
        f"project function entries: {t['entries']} into {t['functions']} distinct functions in {t['files']} files",
        f"  sources: {s['entries']} entries, {s['functions']} functions, {s['files']} files",
        f"  headers: {h['entries']} entries, {h['functions']} functions, {h['files']} files",
        f"  on other threads (the stream worker): {summary['other_threads']} entries",
        f"entries into {HAL_RUNTIME}: {summary['hal_runtime_entries']}",
        f"calls of the HAL's {HAL_GET_DEVICE}: {summary['hal_get_device_calls']}",
        f"layer changes along the path: {summary['layer_changes']}",
        "entries per layer: " + ", ".join(f"{k} {v}" for k, v in summary["per_layer"].items()),
        "entries per file:",
    ]
    lines += [f"  {v:5d}  {k}" for k, v in summary["per_file"].items()]
    lines.append("entries per function:")
    lines += [
        f"  {f['entries']:5d}  {short_name(f['name'])}  ({f['file']}:{f['line']})"
        for f in summary["per_function"]
    ]
    if show_order:
        lines.append("entries in order (* = another thread):")
        lines += [
            f"  {i + 1:4d} {' ' if e['caller'] else '*'} {short_name(e['name'])}  ({e['file']})"
            for i, e in enumerate(summary["order"])
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--op", default="torch.add(a, b)", help="a Python expression over torch, a and b")
    parser.add_argument("--warmups", type=int, default=3, help="calls of the op before the counted one")
    parser.add_argument("--build-dir", type=Path, default=ROOT / "build" / "count-op-path")
    parser.add_argument("--no-build", action="store_true", help="use the Debug build as it is")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="build parallelism")
    parser.add_argument("--order", action="store_true", help="also print the entries in order")
    parser.add_argument("--json", type=Path, help="write the figures (and the entry order) to this file")
    args = parser.parse_args(argv)
    if args.warmups < 0:
        parser.error("--warmups must be at least 0")
    build_dir = args.build_dir.resolve()
    if not args.no_build:
        build(build_dir, args.jobs)
    summary = summarize(count(build_dir, args.op, args.warmups))
    print(report(args.op, summary, args.order))
    if args.json:
        args.json.write_text(json.dumps({"op": args.op, **summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
