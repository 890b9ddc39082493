"""The child of ``harness.processes.run_in_clean_process``:

    python -m harness._clean_process_main REQUEST RESULT ERROR WITH_TORCH_FL

Imports torch_fl first when WITH_TORCH_FL is 1 and never otherwise; imports the request's
``"module:function"``, calls it (on the model ``harness.qwen3.build_model`` builds from the request's
``master``, where it has one) and saves its result to RESULT. A failure writes its traceback to ERROR and
exits 1."""

from __future__ import annotations

import importlib
import sys
import traceback


def serve(request_path: str, result_path: str, with_torch_fl: bool) -> None:
    if with_torch_fl:
        import torch_fl  # noqa: F401
    import torch

    from harness.processes import let_autograd_threads_finish

    request = torch.load(request_path, weights_only=False)
    module, _, name = request["function"].partition(":")
    function = getattr(importlib.import_module(module), name)
    args = []
    if request["master"] is not None:
        from harness.qwen3 import build_model

        args.append(build_model(**request["master"]))
    result = function(*args, **request["kwargs"])
    assert with_torch_fl or "torch_fl" not in sys.modules, "the clean process imported torch_fl"
    torch.save(result, result_path)
    let_autograd_threads_finish()


def main(argv: list[str]) -> int:
    request_path, result_path, error_path, with_torch_fl = argv
    try:
        serve(request_path, result_path, with_torch_fl == "1")
    except BaseException:
        with open(error_path, "w") as f:
            f.write(traceback.format_exc())
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
