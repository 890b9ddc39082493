"""torch_fl.integrations is imported only when asked for: ``import torch_fl`` (and ``torch_fl.integrations``)
imports none of the training libraries."""

from __future__ import annotations

LIBRARIES = ("lightning", "accelerate", "transformers")


def test_importing_torch_fl_imports_no_training_library(run_python):
    result = run_python(
        f"""
        import json, sys
        import torch_fl, torch_fl.integrations
        print("RESULT", json.dumps([name for name in {LIBRARIES!r} if name in sys.modules]))
        """
    ).check()
    assert result.json() == []
