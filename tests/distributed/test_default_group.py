"""Process groups made without naming flagos's backend, on 2 ranks (default_group.py holds what each rank
runs): init_process_group() and init_process_group(device_id=...) serve flagos and CPU tensors, and DDP and
FSDP2 train on them as on a group named for flagos; a "gloo" group serves CPU tensors only."""


def test_groups_made_without_naming_flagos(launch):
    run = launch("default_group", "run", 2, timeout=180).check()
    for rank in run.ranks:
        assert rank.result == {
            "no_backend": ["ddp", "fsdp2_mlp", "fsdp2_mlp_mixed_precision"],
            "device_id": ["ddp"],
            "gloo": ["cpu_collective", "flagos_collective_refused"],
        }
        # torch finds the default (gloo) backend it gives a group made without a backend name: no
        # "No backend of type 1 found ... Assuming no hooks are registered" at destroy_process_group().
        assert "No backend of type" not in rank.stderr, run.logs()
