"""FlexAttention on flagos tensors (opt-in: :func:`torch_fl.compat.enable_flex_attention`).

``torch.nn.attention.flex_attention.flex_attention`` checks its inputs' device against a fixed list of
device types (``_validate_device``) before anything dispatches, and no registration extends the list. While
enabled, that check accepts queries, keys and values that are all flagos tensors and leaves every other call
to torch's check. The rest is torch's: eagerly the attention runs as the composite of ATen ops torch
defines for devices without a fused kernel (forward and backward, on every accelerator); under
``torch.compile`` Inductor lowers non-CPU devices to its Triton templates, so compiled FlexAttention needs
flagos backed by a GPU with Triton (on the simulated accelerator the lowering fails for want of Triton).
"""

from __future__ import annotations

from torch_fl.compat._patch import AttributeWrap


def _module():
    import torch.nn.attention.flex_attention as flex_attention

    return flex_attention


def adapted(original):
    """torch's device check (`original`), passing calls whose query, key and value are all flagos tensors."""

    def validate_device(query, key, value, *args, **kwargs):
        if query.device.type == key.device.type == value.device.type == "flagos":
            return None
        return original(query, key, value, *args, **kwargs)

    validate_device.__wrapped__ = original
    return validate_device


layer = AttributeWrap(
    "torch_fl.compat.enable_flex_attention()", _module, "_validate_device", adapted, lambda: None
)
