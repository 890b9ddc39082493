"""The flagos c10d backend's collectives on the simulated accelerator (or whatever flagos runs on), with 2 and
4 processes: every collective against gloo on CPU tensors, what only flagos has, the three ways to name the
backend, and bad input (collectives.py holds the checks each rank runs)."""

import pytest


@pytest.mark.parametrize("world_size", [2, 4])
def test_collectives(launch, world_size):
    result = launch("collectives", "run", world_size, timeout=180).check().results
    for rank_result in result:
        assert rank_result["init"] == ["no_backend_argument", "device_id", "named_flagos"]
        assert len(rank_result["compared_with_gloo"]) == 11
        assert rank_result["flagos_only"] == [
            "premul_keeps_input",
            "coalescing_manager",
            "futures",
            "functional_avg",
            "dtensor",
            "objects_barrier",
        ]
        assert rank_result["backend"] == "ProcessGroupGloo"
        assert len(rank_result["bad_input"]) == 5
