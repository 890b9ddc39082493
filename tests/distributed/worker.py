"""One rank of a test in this folder: ``python worker.py <module> <function> <json kwargs>``, with RANK,
WORLD_SIZE, LOCAL_RANK and FLAGOS_TEST_STORE set by the launcher (conftest.py). Prints ``RESULT <json>``.
``<module>`` is one of this folder's (a script's own folder is the first entry of its ``sys.path``); the
launcher puts the repository's root on ``PYTHONPATH`` for ``harness``."""

import json
import sys

if __name__ == "__main__":
    import importlib

    from harness.processes import let_autograd_threads_finish

    module, function, kwargs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    result = getattr(importlib.import_module(module), function)(**kwargs)
    print("RESULT " + json.dumps(result), flush=True)
    let_autograd_threads_finish()
