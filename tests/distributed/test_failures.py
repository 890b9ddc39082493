"""A rank that raises, dies or stalls makes the other ranks fail with a clear distributed error within the
timeout (failures.py holds what each rank runs)."""

import pytest

TIMEOUT_S = 5


@pytest.mark.parametrize(
    "mode, check",
    [("raise", "1"), ("die", "0"), ("stall", "1")],
    ids=["raise-checked", "die-unchecked", "stall-checked"],
)
def test_failed_rank_fails_the_others(launch, mode, check):
    # FLAGOS_DIST_CHECK: with it the first call to fail is the comparison across ranks, without it gloo's.
    run = launch(
        "failures",
        "run",
        2,
        args={"mode": mode, "timeout_s": TIMEOUT_S},
        timeout=60,
        env={"FLAGOS_DIST_CHECK": check},
    )
    assert not run.timed_out, run.logs()
    failed, survivor = run.ranks[1], run.ranks[0]
    assert failed.returncode != 0, run.logs()
    result = survivor.result
    assert survivor.returncode == 0 and result is not None, run.logs()
    assert result["error_type"] == "DistBackendError" and result["is_dist_error"], run.logs()
    assert "flagos backend (rank 0): all_reduce" in result["message"], run.logs()
    # Within the group's timeout (a stalled peer takes all of it), plus start-up slack.
    assert result["seconds"] < TIMEOUT_S + 10, run.logs()
    if mode != "stall":
        assert result["seconds"] < TIMEOUT_S, run.logs()


def test_check_setting_follows_rank_0(launch):
    run = launch(
        "failures",
        "check_setting",
        2,
        env={"FLAGOS_DIST_CHECK": "1"},
        rank_env={1: {"FLAGOS_DIST_CHECK": "0"}},
    )
    assert run.check().results == [{"checks": True, "warned": False}, {"checks": True, "warned": True}]
