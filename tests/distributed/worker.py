"""One rank of a test in this folder: ``python worker.py <module> <function> <json kwargs>``, with RANK,
WORLD_SIZE, LOCAL_RANK and FLAGOS_TEST_STORE set by the launcher (conftest.py). Prints ``RESULT <json>``."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

if __name__ == "__main__":
    import importlib

    module, function, kwargs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    result = getattr(importlib.import_module(module), function)(**kwargs)
    print("RESULT " + json.dumps(result), flush=True)
    # Autograd's device threads drop their last graph task before the interpreter exits (torch_fl._qwen3).
    import time

    time.sleep(0.05)
