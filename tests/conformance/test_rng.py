"""Random numbers: torch.Generator(device), torch.manual_seed, fork_rng and the device module's RNG state.

Counterpart of torch_openreg's tests/test_rng.py.
"""

from __future__ import annotations

import copy
import pickle
import warnings

import pytest
import torch

DEVICE = "flagos"

# Every random op, called with an explicit generator (g) on the device.
RANDOM_OPS = {
    "randn": lambda g: torch.randn(64, device=DEVICE, generator=g),
    "rand": lambda g: torch.rand(64, device=DEVICE, generator=g),
    "randint": lambda g: torch.randint(0, 1000, (64,), device=DEVICE, generator=g),
    "randperm": lambda g: torch.randperm(64, device=DEVICE, generator=g),
    "normal_": lambda g: torch.empty(64, device=DEVICE).normal_(generator=g),
    "normal": lambda g: torch.normal(
        torch.zeros(64, device=DEVICE), torch.ones(64, device=DEVICE), generator=g
    ),
    "uniform_": lambda g: torch.empty(64, device=DEVICE).uniform_(generator=g),
    "random_": lambda g: torch.empty(64, device=DEVICE).random_(0, 1000, generator=g),
    "exponential_": lambda g: torch.empty(64, device=DEVICE).exponential_(generator=g),
    "geometric_": lambda g: torch.empty(64, device=DEVICE).geometric_(0.3, generator=g),
    "log_normal_": lambda g: torch.empty(64, device=DEVICE).log_normal_(generator=g),
    "cauchy_": lambda g: torch.empty(64, device=DEVICE).cauchy_(generator=g),
    "bernoulli": lambda g: torch.bernoulli(torch.full((64,), 0.5, device=DEVICE), generator=g),
    "bernoulli_": lambda g: torch.empty(64, device=DEVICE).bernoulli_(0.5, generator=g),
    "multinomial": lambda g: torch.multinomial(torch.ones(64, device=DEVICE), 32, generator=g),
    "poisson": lambda g: torch.poisson(torch.full((64,), 4.0, device=DEVICE), generator=g),
}


def draw(name: str, seed: int) -> torch.Tensor:
    out = RANDOM_OPS[name](torch.Generator(DEVICE).manual_seed(seed))
    assert out.device.type == DEVICE
    return out.cpu()


def test_generator_device(two_devices):
    assert torch.Generator(DEVICE).device == torch.device(DEVICE, 0)
    gen = torch.Generator(device=f"{DEVICE}:1")
    assert gen.device.type == DEVICE and gen.device.index == 1


@pytest.mark.parametrize("name", list(RANDOM_OPS))
def test_generator_drives_every_random_op(name):
    first, again, other = draw(name, 3), draw(name, 3), draw(name, 4)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_generator_seed_and_state_round_trip():
    gen = torch.Generator(DEVICE)
    gen.manual_seed(42)
    assert gen.initial_seed() == 42
    state = gen.get_state()
    assert state.device.type == "cpu" and state.dtype == torch.uint8
    a = torch.randn(8, device=DEVICE, generator=gen).cpu()
    gen.set_state(state)
    assert torch.equal(torch.randn(8, device=DEVICE, generator=gen).cpu(), a)
    clone = torch.Generator(DEVICE).manual_seed(5).clone_state()
    assert torch.equal(
        torch.randn(8, device=DEVICE, generator=clone).cpu(),
        torch.randn(8, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(5)).cpu(),
    )
    assert torch.Generator(DEVICE).seed() != torch.Generator(DEVICE).seed()


def test_generator_pickles_and_deep_copies(backing):
    if backing is None:
        pytest.skip(
            "torch pickles a non-CPU generator with its offset; the simulated accelerator's generator is "
            "CPU's mt19937, which has none (torch_openreg's generator has the same limitation)"
        )
    gen = torch.Generator(DEVICE).manual_seed(11)
    torch.randn(4, device=DEVICE, generator=gen)
    for copied in (pickle.loads(pickle.dumps(gen)), copy.deepcopy(gen)):
        assert copied.device == gen.device
        assert torch.equal(
            torch.randn(4, device=DEVICE, generator=copied).cpu(),
            torch.randn(4, device=DEVICE, generator=gen.clone_state()).cpu(),
        )


def test_torch_manual_seed_seeds_the_device():
    torch.manual_seed(7)
    a = torch.randn(8, device=DEVICE).cpu()
    dropped = torch.nn.functional.dropout(torch.ones(64, device=DEVICE), 0.5).cpu()
    torch.manual_seed(7)
    assert torch.equal(torch.randn(8, device=DEVICE).cpu(), a)
    assert torch.equal(torch.nn.functional.dropout(torch.ones(64, device=DEVICE), 0.5).cpu(), dropped)
    assert torch.get_device_module(DEVICE).initial_seed() == 7


def test_fork_rng_restores_device_state():
    torch.manual_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "you have N devices" advice
        with torch.random.fork_rng(device_type=DEVICE):
            inside = torch.randn(4, device=DEVICE).cpu()
            torch.randn(100, device=DEVICE)
    after = torch.randn(4, device=DEVICE).cpu()
    assert torch.equal(inside, after)


def test_device_module_rng_state_round_trip(two_devices):
    module = torch.get_device_module(DEVICE)
    state = module.get_rng_state(1)
    a = torch.randn(4, device=f"{DEVICE}:1").cpu()
    module.set_rng_state(state, 1)
    assert torch.equal(torch.randn(4, device=f"{DEVICE}:1").cpu(), a)
    states = module.get_rng_state_all()
    assert len(states) == torch.accelerator.device_count()
    b = [torch.randn(4, device=f"{DEVICE}:{i}").cpu() for i in range(len(states))]
    module.set_rng_state_all(states)
    assert all(torch.equal(torch.randn(4, device=f"{DEVICE}:{i}").cpu(), b[i]) for i in range(len(states)))


def test_default_generators_are_per_device(two_devices):
    module = torch.get_device_module(DEVICE)
    assert [g.device for g in module.default_generators] == [
        torch.device(DEVICE, i) for i in range(torch.accelerator.device_count())
    ]
    module.manual_seed_all(0)
    a = torch.randn(4, device=f"{DEVICE}:1").cpu()
    module.manual_seed_all(0)
    torch.randn(100, device=f"{DEVICE}:0")  # consuming device 0's stream leaves device 1's alone
    assert torch.equal(torch.randn(4, device=f"{DEVICE}:1").cpu(), a)


def test_manual_seed_and_seed_all():
    module = torch.get_device_module(DEVICE)
    module.manual_seed_all(42)
    assert module.initial_seed() == 42
    module.seed_all()
    first = module.initial_seed()
    module.seed_all()
    assert module.initial_seed() != first


def test_generator_offset(backing):
    if backing is None:
        pytest.skip("CPU's mt19937 behind the simulated accelerator has no offset (as torch_openreg's)")
    gen = torch.Generator(DEVICE).manual_seed(0)
    gen.set_offset(8)
    assert gen.get_offset() == 8
