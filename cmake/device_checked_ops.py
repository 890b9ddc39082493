"""Writes the table of operators whose CUDA kernels refuse tensors of two devices (build step, CMakeLists.txt).

torch's code generator gives every kernel of a device-guarded backend (CUDA, XPU) a device check: each tensor
argument (out= ones first, then the positional ones) must be on the device of the first, unless the
operator's entry in native_functions.yaml says ``device_check: NoCheck`` (TensorIterator ops, which take
0-dim CPU tensors, copies, indexing with CPU indices, the foreach ops). Of those, the ones the yaml marks
``# TensorIterator`` check in their TensorIterator instead: every tensor on one device but 0-dim CPU inputs.
A host kernel, which runs the simulated accelerator's calls on native aliases, has neither check, so flagos
reproduces both from this table (csrc/ops/routes/device_checks.cpp): the operators with a CUDA kernel and a
check, each with its kind and the arguments checked, in torch's order, outputs marked ``!``. Read from the
yaml that ships with the installed torch (torchgen/packaged), so the table matches the torch being built
against.

    python cmake/device_checked_ops.py OUTPUT [YAML_DIR]

Where torch ships no yaml the table is empty: the checks are not made (CMakeLists.txt warns).
"""

from __future__ import annotations

import os
import sys


def packaged_yaml_dir() -> str | None:
    try:
        import torchgen
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(torchgen.__file__), "packaged", "ATen", "native")
    return path if os.path.isfile(os.path.join(path, "native_functions.yaml")) else None


def read_entries(path: str) -> list[dict]:
    """The entries of native_functions.yaml with the keys this table needs: `func`, `device_check` (and
    whether its comment says TensorIterator), `structured_delegate`, whether it has `ufunc_inner_loop`, and
    its `dispatch` keys. Read line by line (the file's layout is regular), so the build needs no YAML
    library."""
    entries: list[dict] = []
    section = None
    for raw in open(path):
        line, _, comment = raw.partition("#")
        line = line.rstrip()
        if not line.strip():
            continue
        if line.startswith("- func:"):
            entries.append({"func": line[len("- func:") :].strip(), "dispatch": set()})
            section = None
        elif line.startswith("    ") and section == "dispatch":
            keys = line.strip().split(":", 1)[0]
            entries[-1]["dispatch"].update(k.strip() for k in keys.split(","))
        elif line.startswith("  ") and not line.startswith("   "):
            key, _, value = line.strip().partition(":")
            section = key
            if key in ("device_check", "structured_delegate"):
                entries[-1][key] = value.strip()
            if key == "device_check":
                entries[-1]["tensor_iterator"] = comment.strip().startswith("TensorIterator")
            elif key == "ufunc_inner_loop":
                entries[-1][key] = True
    return entries


# TensorIterator ops whose other tensors may be on another device by design: indices on the CPU, and
# bernoulli's probabilities, which CUDA's kernel moves to self's device.
NOT_TENSOR_ITERATOR_CHECKED = {"index", "_index_put_impl_", "index_fill_", "bernoulli", "bernoulli_"}


def checked_ops(yaml_dir: str) -> list[tuple[str, str, list[str], bool]]:
    """(aten::name, overload, argument names in check order with outputs marked "!", whether the check is
    TensorIterator's) of every operator whose CUDA kernel checks devices and that can meet two devices (two
    tensor arguments, or a tensor list)."""
    from torchgen.model import FunctionSchema

    entries = read_entries(os.path.join(yaml_dir, "native_functions.yaml"))
    schemas = {id(e): FunctionSchema.parse(e["func"]) for e in entries}
    by_name = {str(schemas[id(e)].name): e for e in entries}

    def has_cuda_kernel(e: dict) -> bool:
        # A ufunc op's CUDA kernel is generated from its inner loops.
        return "CUDA" in e["dispatch"] or e.get("ufunc_inner_loop", False)

    table = []
    for e in entries:
        # A structured op's functional and in-place forms share its out= form's kernel (and its check).
        kernel_of = by_name[e["structured_delegate"]] if "structured_delegate" in e else e
        schema = schemas[id(e)]
        tensor_iterator = e.get("device_check") == "NoCheck" and e.get("tensor_iterator", False)
        if tensor_iterator and str(schema.name.name) in NOT_TENSOR_ITERATOR_CHECKED:
            continue
        if (e.get("device_check") == "NoCheck" and not tensor_iterator) or not has_cuda_kernel(kernel_of):
            continue
        checked = [*schema.arguments.out, *schema.arguments.flat_positional]
        tensors = [a for a in checked if a.type.is_tensor_like()]
        if len(tensors) < 2 and not any(a.type.is_list_like() for a in tensors):
            continue
        names = [
            ("!" if a.annotation is not None and a.annotation.is_write else "") + a.name for a in tensors
        ]
        table.append((f"aten::{schema.name.name}", schema.name.overload_name, names, tensor_iterator))
    return table


def main() -> int:
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    output = sys.argv[1]
    yaml_dir = sys.argv[2] if len(sys.argv) == 3 else packaged_yaml_dir()
    table = checked_ops(yaml_dir) if yaml_dir else []
    lines = [
        "// Generated by cmake/device_checked_ops.py from torch's native_functions.yaml: the operators whose",
        "// CUDA kernels check that their tensors share a device, the arguments checked in torch's order",
        "// (outputs marked !), and whether the check is TensorIterator's.",
    ]
    lines += [
        f'{{"{name}", "{overload}", "{",".join(args)}", {str(iterator).lower()}}},'
        for name, overload, args, iterator in table
    ]
    text = "\n".join(lines) + "\n"
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    # Rewritten only when it changes, so that a re-run does not recompile its includer.
    if not os.path.exists(output) or open(output).read() != text:
        with open(output, "w") as f:
            f.write(text)
    if not yaml_dir:
        print(
            "torch_fl: torch ships no native_functions.yaml (torchgen/packaged): building without the "
            "same-device checks of host kernels",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
