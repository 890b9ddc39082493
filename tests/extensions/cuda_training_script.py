"""A small training script written for CUDA, the way such scripts are written: a device argument that
defaults to "cuda", .cuda() on the model, pinned host batches copied with non_blocking, a side stream,
timing events, seeding and memory statistics through torch.cuda.

tests/extensions/test_compat_cuda.py runs this file unchanged: on the simulated accelerator after
``import torch_fl.compat.cuda`` (where "cuda" is flagos), and with ``--device cpu`` as the reference. It prints
one line, ``RESULT <json>``.
"""

import argparse
import json

import torch
from torch import nn


def build_model():
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 4))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    device = torch.device(args.device)
    use_cuda = device.type == "cuda"

    torch.manual_seed(0)
    if use_cuda:
        torch.cuda.manual_seed_all(0)
        torch.cuda.set_device(0)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()

    model = build_model()
    model = model.cuda() if use_cuda else model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loss_fn = nn.CrossEntropyLoss()

    generator = torch.Generator().manual_seed(1)
    data = torch.randn(256, 32, generator=generator)
    target = torch.randint(0, 4, (256,), generator=generator)
    if use_cuda:
        data = data.pin_memory()
        target = target.pin_memory()
        stream = torch.cuda.Stream()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()

    losses = []
    for step in range(args.steps):
        rows = slice((step * 32) % 256, (step * 32) % 256 + 32)
        x = data[rows].to(device, non_blocking=True)
        y = target[rows].to(device, non_blocking=True)
        if use_cuda:
            # Forward and backward on a side stream, ordered after the copies and before the next step.
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                loss = loss_fn(model(x), y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            torch.cuda.current_stream().wait_stream(stream)
        else:
            loss = loss_fn(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        losses.append(loss.item())

    result = {
        "losses": losses,
        "parameters": [p.detach().cpu().flatten().tolist() for p in model.parameters()],
        "parameter_device": str(next(model.parameters()).device),
    }
    if use_cuda:
        end.record()
        torch.cuda.synchronize()
        result["elapsed_ms"] = start.elapsed_time(end)
        result["peak_bytes"] = torch.cuda.max_memory_allocated()
        result["device_name"] = torch.cuda.get_device_name()
        result["cuda_available"] = torch.cuda.is_available()
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
