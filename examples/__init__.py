"""Examples of torch_fl in use, run as modules from the repository's root: ``python -m examples.qwen3_demo``."""
