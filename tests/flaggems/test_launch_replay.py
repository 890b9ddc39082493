"""FlagGems launch replay on the simulated accelerator (csrc/ops/routes/launch_replay.h): a signature's
calls recorded, replayed from C++ once two recordings agree, refused for each reason a plan cannot be
made, switched off, bounded, shared by threads, on side streams, other devices and in graphs. The
scenarios run together in one fresh process (tests/flaggems/replay_scenarios.py) with the FlagGems-shaped
stand-in of harness/launch_stand_in as the flaggems backend; each test asserts on one of them. The real
FlagGems on the GPU: tests/flaggems/test_flaggems_replay.py."""

from __future__ import annotations

import os

import pytest

from harness.processes import python_env

SCENARIOS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "replay_scenarios.py")
SIM = {"FLAGOS_ACCELERATOR": "sim"}


def _env(**extra):
    # This process's PYTHONPATH is kept: where packages come from a folder on it (expecttest for the
    # sweep's OpInfo samples, on a machine without network), the scenarios need them too.
    env = python_env({**SIM, "PYTHONPATH": os.environ.get("PYTHONPATH", ""), **extra})
    return {k: v for k, v in env.items() if k in ("PYTHONPATH", *SIM, *extra)}


@pytest.fixture(scope="module")
def results(run_python):
    result = run_python("", env=_env(), args=[SCENARIOS], timeout=600).check()
    return result.json()


NAMES = [
    "replays_after_two_agreeing_recordings",
    "every_argument_kind",
    "narrow_and_half_arguments",
    "copies_and_fills_inside_the_wrapper",
    "broadcasting_inside_the_wrapper",
    "host_scalars_are_keyed_by_value",
    "another_implementation_forgets_the_plans",
    "signatures_apart",
    "matmul_precision_is_in_the_signature",
    "autotuned_first_call_is_not_replayed",
    "refusals_by_reason",
    "a_pointer_past_an_allocation_is_not_guessed",
    "a_recorder_that_cannot_classify_refuses",
    "views_of_one_storage_are_keyed_by_their_distance",
    "a_view_of_an_argument_follows_it",
    "a_call_flaggems_fails_runs_natively",
    "out_adapters_are_replayed",
    "an_error_inside_a_recording_keeps_its_message",
    "switched_off",
    "bounded_cache",
    "threads_share_plans",
    "side_stream_and_second_device",
    "graph_replays_the_plan",
    "sweep_replay_check",
]


@pytest.mark.parametrize("name", NAMES)
def test_scenario(results, name):
    assert name in results, f"the scenario script did not run {name}"
    assert results[name] == "ok", results[name]


def test_env_switch_and_dispatch_log(run_python):
    code = """
        import json, torch, torch_fl
        from harness.launch_stand_in import flag_gems_like
        from torch_fl import routing
        flag_gems_like.install()
        with routing.override({"aten::add.Tensor": "flaggems"}):
            for _ in range(4):
                torch.add(torch.ones(8, device="flagos"), torch.ones(8, device="flagos"))
        print("RESULT " + json.dumps([routing.replay_enabled(), routing.replay_counts()["replayed"]]))
    """
    off = run_python(code, env=_env(FLAGOS_FLAGGEMS_REPLAY="0")).check()
    assert off.json() == [False, 0]
    logged = run_python(code, env=_env(FLAGOS_LOG_DISPATCH="1")).check()
    assert logged.json() == [True, 2]
    for words in ("aten::add.Tensor flaggems records", "armed a plan", "aten::add.Tensor flaggems replayed"):
        assert words in logged.stderr, logged.stderr[-3000:]
