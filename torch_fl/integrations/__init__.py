"""flagos in the libraries people train with, each through the library's own extension point
(docs/ecosystem.md):

- ``torch_fl.integrations.lightning``: Lightning's ``Trainer(accelerator="flagos", strategy="single_flagos"
  | "ddp_flagos", ...)``: an accelerator and strategies registered under those names.
- ``torch_fl.integrations.accelerate``: :func:`~torch_fl.integrations.accelerate.flagos_state`, accelerate's
  process state on flagos (one process, or one per rank under ``torchrun``/``accelerate launch``).
- ``torch_fl.integrations.transformers``: ``FlagosTrainingArguments``, the Hugging Face ``Trainer``'s
  arguments with their device on flagos.

Each module imports its library when it is imported itself; ``import torch_fl`` imports none of them.
"""
