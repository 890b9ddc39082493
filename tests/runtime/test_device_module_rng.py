"""Random number generators through the device module, torch.flagos: per-device default generators, seeding
and state of one device or all. The generic contract (torch.Generator(device), every random op, fork_rng)
is tests/conformance/test_rng.py."""

from __future__ import annotations

import pytest
import torch


def test_default_generators(device_count):
    gens = torch.flagos.default_generators
    assert len(gens) == device_count
    for index, gen in enumerate(gens):
        assert isinstance(gen, torch.Generator)
        assert gen.device == torch.device("flagos", index)
    assert gens[0] is torch.flagos.default_generators[0], "default generators must be singletons"
    assert len(list(iter(gens))) == device_count


def test_generator_object():
    g = torch.Generator("flagos")
    assert g.device.type == "flagos"
    g.manual_seed(1234)
    assert g.initial_seed() == 1234
    state = g.get_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu" and state.numel() > 0
    g.manual_seed(99)
    assert not torch.equal(g.get_state(), state)
    g.set_state(state)
    assert torch.equal(g.get_state(), state)
    assert g.initial_seed() == 1234


def test_generator_on_second_device(two_devices_only):
    g = torch.Generator(device="flagos:1")
    assert g.device == torch.device("flagos", 1)


def test_same_seed_same_state():
    a = torch.Generator("flagos").manual_seed(7)
    b = torch.Generator("flagos").manual_seed(7)
    c = torch.Generator("flagos").manual_seed(8)
    assert torch.equal(a.get_state(), b.get_state())
    assert not torch.equal(a.get_state(), c.get_state())


def test_generator_set_state_rejects_bad_state():
    g = torch.Generator("flagos")
    with pytest.raises(RuntimeError):
        g.set_state(torch.zeros(3, dtype=torch.uint8))


def test_manual_seed_current_device_only(two_devices_only):
    torch.flagos.manual_seed_all(11)
    torch.flagos.manual_seed(5)
    assert torch.flagos.initial_seed() == 5
    assert torch.flagos.default_generators[0].initial_seed() == 5
    assert torch.flagos.default_generators[1].initial_seed() == 11
    with torch.flagos.device(1):
        torch.flagos.manual_seed(6)
        assert torch.flagos.initial_seed() == 6
    assert torch.flagos.default_generators[0].initial_seed() == 5
    assert torch.flagos.default_generators[1].initial_seed() == 6


def test_manual_seed_all(device_count):
    torch.flagos.manual_seed_all(42)
    assert [g.initial_seed() for g in torch.flagos.default_generators] == [42] * device_count
    states = torch.flagos.get_rng_state_all()
    assert len(states) == device_count
    assert all(torch.equal(s, states[0]) for s in states)


def test_seed_and_seed_all(device_count):
    torch.flagos.manual_seed_all(3)
    torch.flagos.seed()
    first = torch.flagos.initial_seed()
    torch.flagos.seed()
    second = torch.flagos.initial_seed()
    assert first != second, "seed() must pick a new non-deterministic seed"
    torch.flagos.seed_all()
    seeds = {g.initial_seed() for g in torch.flagos.default_generators}
    assert len(seeds) == 1 and seeds != {3}


def test_rng_state_roundtrip(device_count):
    torch.flagos.manual_seed(21)
    state = torch.flagos.get_rng_state()
    assert torch.equal(state, torch.flagos.get_rng_state(0))
    assert torch.equal(state, torch.flagos.get_rng_state("flagos:0"))
    torch.flagos.manual_seed(22)
    assert not torch.equal(torch.flagos.get_rng_state(), state)
    torch.flagos.set_rng_state(state)
    assert torch.equal(torch.flagos.get_rng_state(), state)
    assert torch.flagos.initial_seed() == 21

    torch.flagos.manual_seed_all(1)
    all_states = torch.flagos.get_rng_state_all()
    torch.flagos.manual_seed_all(2)
    torch.flagos.set_rng_state_all(all_states)
    assert all(torch.equal(a, b) for a, b in zip(torch.flagos.get_rng_state_all(), all_states, strict=True))


def test_set_rng_state_on_other_device(two_devices_only):
    torch.flagos.manual_seed_all(0)
    g = torch.Generator("flagos").manual_seed(77)
    torch.flagos.set_rng_state(g.get_state(), 1)
    assert torch.equal(torch.flagos.get_rng_state(1), g.get_state())
    assert torch.flagos.default_generators[1].initial_seed() == 77
    assert torch.flagos.default_generators[0].initial_seed() == 0


def test_torch_manual_seed_seeds_flagos(device_count):
    torch.manual_seed(123)
    assert [g.initial_seed() for g in torch.flagos.default_generators] == [123] * device_count


def test_fork_rng_restores_flagos_state():
    torch.flagos.manual_seed(31)
    before = torch.flagos.get_rng_state()
    with torch.random.fork_rng(devices=range(torch.flagos.device_count()), device_type="flagos"):
        torch.flagos.manual_seed(32)
        assert torch.flagos.initial_seed() == 32
    assert torch.equal(torch.flagos.get_rng_state(), before)
    assert torch.flagos.initial_seed() == 31
