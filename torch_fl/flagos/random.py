"""Random number generators of the flagos devices (torch.cuda.random's API)."""

from __future__ import annotations

from typing import Any

import torch

from torch_fl import _C

from ._utils import _device_index, _lazy_init


def _generators() -> tuple:
    global _default_generators_cache
    if _default_generators_cache is None:
        _lazy_init()
        _default_generators_cache = tuple(_C._default_generator(i) for i in range(_C._device_count()))
    return _default_generators_cache


_default_generators_cache: tuple | None = None


class _LazyGenerators:
    """``torch.flagos.default_generators``: a tuple-like view created on first access (creating the
    generators initialises the accelerator, which import must not do)."""

    def __getitem__(self, index):
        return _generators()[index]

    def __len__(self) -> int:
        return len(_generators())

    def __iter__(self):
        return iter(_generators())

    def __repr__(self) -> str:
        return repr(_generators())


default_generators = _LazyGenerators()


def _generator(device: Any) -> torch.Generator:
    index = _device_index(device)
    generators = _generators()
    if not 0 <= index < len(generators):
        raise IndexError(
            f"invalid flagos device index {index}: {len(generators)} flagos device(s) available"
            + (f" (valid: 0..{len(generators) - 1})" if generators else "")
        )
    return generators[index]


def manual_seed(seed: int) -> None:
    """Seeds the generator of the current device."""
    _generator(None).manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for gen in _generators():
        gen.manual_seed(int(seed))


def seed() -> None:
    """Seeds the current device's generator with a non-deterministic random number."""
    _generator(None).seed()


def seed_all() -> None:
    gens = _generators()
    if gens:
        random_seed = gens[0].seed()
        for gen in gens[1:]:
            gen.manual_seed(random_seed)


def initial_seed() -> int:
    return _generator(None).initial_seed()


def get_rng_state(device: Any = "flagos") -> torch.Tensor:
    """The state of `device`'s generator as a CPU ByteTensor."""
    return _generator(device).get_state()


def get_rng_state_all() -> list[torch.Tensor]:
    return [gen.get_state() for gen in _generators()]


def set_rng_state(new_state: torch.Tensor, device: Any = "flagos") -> None:
    _generator(device).set_state(new_state.clone(memory_format=torch.contiguous_format))


def set_rng_state_all(new_states) -> None:
    for index, state in enumerate(new_states):
        set_rng_state(state, index)
