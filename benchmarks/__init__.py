"""The benchmarks of torch_fl, each run as a module from the repository's root: ``python -m benchmarks.qwen3``."""
