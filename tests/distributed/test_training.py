"""Stock DDP and FSDP2 training on flagos with several processes (training.py holds what each rank runs):
DDP equal to single-process training on the concatenated batch, FSDP2 equal to DDP, and a distributed
checkpoint written by 2 ranks and loaded by 4 and by 1."""

import pytest


@pytest.mark.parametrize("world_size", [2, 4])
def test_ddp(launch, world_size):
    # Qwen3 on 2 ranks; 4 ranks repeat the MLP variants only (CI time).
    qwen3 = world_size == 2
    results = launch("training", "run_ddp", world_size, args={"qwen3": qwen3}, timeout=240).check().results
    for r in results:
        assert r["mlp"] == [
            "default",
            "find_unused_parameters",
            "static_graph",
            "gradient_as_bucket_view",
            "device_timer",
            "no_sync",
            "fp16_compress_hook",
            "bf16_compress_hook",
        ]
        assert r.get("qwen3") == (["qwen3_find_unused_False", "qwen3_find_unused_True"] if qwen3 else None)


@pytest.mark.slow
def test_fsdp2_and_checkpoint_resharding(launch, tmp_path):
    results = (
        launch("training", "run_fsdp", 2, args={"checkpoint": str(tmp_path)}, timeout=240).check().results
    )
    for r in results:
        assert r["mlp"] == ["fsdp2_mlp", "fsdp2_mlp_mixed_precision"]
        assert r["qwen3"][-2:] == ["fsdp2_qwen3", "dcp_save"]
    for world_size in (4, 1):
        loaded = launch("training", "run_load", world_size, args={"checkpoint": str(tmp_path)}, timeout=180)
        assert [r["loaded_by"] for r in loaded.check().results] == [world_size] * world_size
