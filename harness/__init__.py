"""What the tests, benchmarks, tools and examples of this repository share: not part of torch_fl.

- ``qwen3``: the Qwen3 model the entry points run (shapes, build, copies, tolerances, comparisons, greedy
  generation, training steps);
- ``static_decode``: greedy decoding with a static KV cache, its step replayed as a graph;
- ``processes``: functions run in a clean Python process, and two processes taking turns;
- ``cpus``: CPU lists as ``taskset -c`` writes them, and binding a process's threads to one;
- ``opinfo``, ``opinfo_variants``: PyTorch's OpInfo database as the judge of the flagos device;
- ``flaggems``: what FlagGems checks share (tolerances, the call counter, bitwise comparison, the replay
  check);
- ``fake_flaggems/``: a stand-in FlagGems for the CPU tests of the flaggems backend;
- ``launch_stand_in/``: a FlagGems- and Triton-shaped kernel library for the simulated accelerator, which
  the tests of launch replay serve as the flaggems backend.

The dependencies run one way: tests, benchmarks, tools and examples import this package, never the other
way round. It is not installed: tests run from the repository's root (pyproject.toml's ``pythonpath``), and
the scripts run as modules from there (``python -m benchmarks.qwen3``); ``processes.python_env`` puts the
root on the ``PYTHONPATH`` of the processes they start. No module here imports torch_fl when it is imported
(tests/tools/test_harness.py checks it), so that a reference process, which must never import torch_fl, can
use them all; what needs torch_fl imports it where it is called.
"""
