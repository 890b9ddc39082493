"""cmake/device_checked_ops.py, the build step that reads which operators' CUDA kernels check their tensors'
devices from torch's native_functions.yaml: the table holds what cuda refuses and nothing it takes, its line
reader agrees with torchgen's own YAML parser (and with the yaml's TensorIterator comments), and an unchanged
table is not rewritten."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "cmake" / "device_checked_ops.py"


def _yaml_dir() -> str:
    import torchgen

    path = os.path.join(os.path.dirname(torchgen.__file__), "packaged", "ATen", "native")
    if not os.path.isfile(os.path.join(path, "native_functions.yaml")):
        pytest.skip("this torch ships no native_functions.yaml")
    return path


def _generate(out: pathlib.Path) -> dict:
    """{(name, overload): (arguments, whether the check is TensorIterator's)} of the written table."""
    subprocess.run([sys.executable, str(SCRIPT), str(out), _yaml_dir()], check=True)
    rows = re.findall(r'^\{"([^"]+)", "([^"]*)", "([^"]*)", (true|false)\},$', out.read_text(), re.M)
    assert len(rows) == out.read_text().count("\n{"), "every row parsed"
    return {(name, overload): (args.split(","), kind == "true") for name, overload, args, kind in rows}


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return _generate(tmp_path_factory.mktemp("generated") / "device_checked_ops.inc")


@pytest.fixture(scope="module")
def checked(table):
    """The rows of the generated check (kSameDevice)."""
    return {op: args for op, (args, iterator) in table.items() if not iterator}


@pytest.fixture(scope="module")
def iterator_checked(table):
    """The rows of TensorIterator's check (kTensorIterator)."""
    return {op: args for op, (args, iterator) in table.items() if iterator}


def test_the_table_holds_what_cuda_refuses_and_not_what_it_takes(checked):
    assert checked[("aten::mm", "out")] == ["!out", "self", "mat2"]  # out= first, as torch checks
    assert checked[("aten::index_select", "")] == ["self", "index"]
    assert checked[("aten::cat", "")] == ["tensors"]  # one list argument
    exempt = [
        ("aten::add", "Tensor"),
        ("aten::where", "self"),
        ("aten::index", "Tensor"),
        ("aten::copy_", ""),
    ]
    exempt.append(("aten::_foreach_add_", "List"))
    for op in exempt:
        assert op not in checked, op  # device_check: NoCheck
    assert ("aten::relu", "") not in checked  # one tensor: nothing to compare


def test_tensor_iterator_ops_are_checked_as_their_tensor_iterator_does(iterator_checked):
    assert iterator_checked[("aten::where", "self")] == ["condition", "self", "other"]
    assert iterator_checked[("aten::add_", "Tensor")] == ["!self", "other"]  # in place: self is written
    assert iterator_checked[("aten::sin", "out")] == ["!out", "self"]
    for op in [
        ("aten::index", "Tensor"),
        ("aten::index_fill_", "int_Tensor"),
        ("aten::bernoulli_", "Tensor"),
    ]:
        assert op not in iterator_checked, op  # indices, probabilities: another device by design
    assert ("aten::sin", "") not in iterator_checked  # one tensor


def test_tensor_iterator_rows_are_the_yaml_entries_marked_so(iterator_checked):
    """Every entry whose device_check line carries the TensorIterator comment, with a CUDA kernel (its
    own or its structured delegate's) and two tensors, but the ones taking other devices by design."""
    text = open(os.path.join(_yaml_dir(), "native_functions.yaml")).read()
    marked = set()
    for entry in re.split(r"\n(?=- func:)", text):
        func = re.match(r"- func: ([\w.]+)\(", entry)
        if func and re.search(r"device_check: NoCheck\s+# TensorIterator", entry):
            marked.add(func[1])
    found = {
        f"{name[len('aten::') :]}{'.' + overload if overload else ''}" for name, overload in iterator_checked
    }
    assert found <= marked
    assert {"where.self", "where.self_out", "logical_and.out", "add.out", "sum.IntList_out"} <= found


def test_the_line_reader_agrees_with_torchgen(checked):
    pytest.importorskip("yaml")  # torchgen's parser needs it; the build step does not
    from torchgen.gen import parse_native_yaml
    from torchgen.model import DeviceCheckType, DispatchKey

    yaml_dir = _yaml_dir()
    parsed = parse_native_yaml(
        os.path.join(yaml_dir, "native_functions.yaml"), os.path.join(yaml_dir, "tags.yaml")
    )
    cuda = parsed.backend_indices[DispatchKey.CUDA]
    by_name = {str(f.func.name): f for f in parsed.native_functions}
    expected = {}
    for f in parsed.native_functions:
        kernel_of = by_name[str(f.structured_delegate)] if f.structured_delegate is not None else f
        if f.device_check == DeviceCheckType.NoCheck or not cuda.has_kernel(kernel_of):
            continue
        arguments = [*f.func.arguments.out, *f.func.arguments.flat_positional]
        tensors = [a for a in arguments if a.type.is_tensor_like()]
        if len(tensors) >= 2 or any(a.type.is_list_like() for a in tensors):
            names = [
                ("!" if a.annotation is not None and a.annotation.is_write else "") + a.name for a in tensors
            ]
            expected[(f"aten::{f.func.name.name}", f.func.name.overload_name)] = names
    assert checked == expected


def test_an_unchanged_table_is_not_rewritten(tmp_path):
    out = tmp_path / "device_checked_ops.inc"
    _generate(out)
    written = out.stat().st_mtime_ns
    _generate(out)
    assert out.stat().st_mtime_ns == written
