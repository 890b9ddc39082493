"""cmake/device_checked_ops.py, the build step that reads which operators' CUDA kernels check their tensors'
devices from torch's native_functions.yaml: the table holds what cuda refuses and nothing it takes, its line
reader agrees with torchgen's own YAML parser, and an unchanged table is not rewritten."""

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
    subprocess.run([sys.executable, str(SCRIPT), str(out), _yaml_dir()], check=True)
    rows = re.findall(r'^\{"([^"]+)", "([^"]*)", "([^"]*)"\},$', out.read_text(), re.M)
    return {(name, overload): args.split(",") for name, overload, args in rows}


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    return _generate(tmp_path_factory.mktemp("generated") / "device_checked_ops.inc")


def test_the_table_holds_what_cuda_refuses_and_not_what_it_takes(checked):
    assert checked[("aten::mm", "out")] == ["out", "self", "mat2"]  # out= first, as torch checks
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
            expected[(f"aten::{f.func.name.name}", f.func.name.overload_name)] = [a.name for a in tensors]
    assert checked == expected


def test_an_unchanged_table_is_not_rewritten(tmp_path):
    out = tmp_path / "device_checked_ops.inc"
    _generate(out)
    written = out.stat().st_mtime_ns
    _generate(out)
    assert out.stat().st_mtime_ns == written
