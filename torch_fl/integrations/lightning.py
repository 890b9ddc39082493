"""Lightning (the ``lightning`` package) on flagos: an accelerator and two strategies, registered under names.

Importing this module registers them with Lightning's registries (``AcceleratorRegistry``,
``StrategyRegistry``), as Lightning registers its own::

    import torch_fl.integrations.lightning  # noqa: F401
    trainer = L.Trainer(accelerator="flagos", strategy="single_flagos", devices=1, precision="bf16-mixed")
    trainer = L.Trainer(accelerator="flagos", strategy="ddp_flagos", devices=2, precision="bf16-mixed")

The strategy is named because Lightning's connector picks the automatic one (``strategy="auto"``) only for
the accelerators it knows: for any other it makes a single-device strategy on the CPU, or its stock DDP
strategy, which builds DDP under a ``torch.cuda.Stream``. Its mixed-precision plugin is likewise made for
autocast on ``"cuda"`` for every accelerator but the CPU and MPS. So the flagos strategies run mixed
precision on flagos (:meth:`_FlagosPrecisionDevice.precision_plugin`), and the flagos accelerator refuses,
with the fix in its message, a strategy that would leave the model off flagos.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.fabric.accelerators.registry import _AcceleratorRegistry
from lightning.fabric.strategies.registry import _StrategyRegistry
from lightning.pytorch.accelerators import Accelerator, AcceleratorRegistry
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy, StrategyRegistry
from lightning.pytorch.utilities.exceptions import MisconfigurationException

import torch_fl  # noqa: F401  (registers the flagos device)

DEVICE_TYPE = "flagos"
ACCELERATOR_NAME = "flagos"
SINGLE_DEVICE_STRATEGY = "single_flagos"
DDP_STRATEGIES = {"ddp_flagos": "popen", "ddp_spawn_flagos": "spawn"}


def _parse_device_indices(devices: int | str | list[int]) -> list[int]:
    """The flagos device indices that ``Trainer(devices=...)`` asks for, as Lightning reads it for GPUs: N > 0
    is devices 0..N-1, -1 all of them, "0,1" or [0, 1] those indices."""
    count = torch.flagos.device_count()
    if isinstance(devices, str):
        text = devices.strip()
        if "," in text:
            devices = [int(part) for part in text.split(",") if part.strip()]
        else:
            try:
                devices = int(text)
            except ValueError:
                raise MisconfigurationException(
                    f"devices={devices!r} is not a number of flagos devices or a list of their indices"
                ) from None
    if isinstance(devices, int):
        if devices == -1:
            devices = count
        if devices < 1:
            raise MisconfigurationException(f"devices={devices} asks for no flagos device")
        if devices > count:
            raise MisconfigurationException(
                f"devices={devices} asks for more flagos devices than the {count} here"
            )
        return list(range(devices))
    indices = list(devices)
    if not indices or not all(isinstance(index, int) for index in indices):
        raise MisconfigurationException(f"devices={devices!r} is not a list of flagos device indices")
    if len(set(indices)) != len(indices):
        raise MisconfigurationException(f"devices={devices!r} names a flagos device twice")
    for index in indices:
        if not 0 <= index < count:
            raise MisconfigurationException(
                f"flagos device {index} does not exist: {count} flagos devices here"
            )
    return indices


class FlagosAccelerator(Accelerator):
    """Lightning's accelerator for flagos devices, registered as ``"flagos"``."""

    def setup_device(self, device: torch.device) -> None:
        if device.type != DEVICE_TYPE:
            raise MisconfigurationException(
                f"The flagos accelerator was given the {device} device: Lightning's automatic strategy places "
                f"the model on the CPU for accelerators it does not know. Pass "
                f"strategy='{SINGLE_DEVICE_STRATEGY}' (one device) or strategy='ddp_flagos' (several) with "
                f"accelerator='flagos' (import torch_fl.integrations.lightning registers them)."
            )
        torch.flagos.set_device(device)

    def setup(self, trainer) -> None:
        plugin = trainer.strategy.precision_plugin
        if isinstance(plugin, MixedPrecision) and plugin.device != DEVICE_TYPE:
            raise MisconfigurationException(
                f"Mixed precision would autocast on '{plugin.device}', not on flagos, where the model runs: "
                f"use strategy='{SINGLE_DEVICE_STRATEGY}' or strategy='ddp_flagos', which autocast on flagos"
            )

    def teardown(self) -> None:
        pass

    @staticmethod
    def parse_devices(devices: int | str | list[int]) -> list[int]:
        return _parse_device_indices(devices)

    @staticmethod
    def get_parallel_devices(devices: list[int]) -> list[torch.device]:
        return [torch.device(DEVICE_TYPE, index) for index in devices]

    @staticmethod
    def auto_device_count() -> int:
        return torch.flagos.device_count()

    @staticmethod
    def is_available() -> bool:
        return torch.flagos.device_count() > 0

    @staticmethod
    def name() -> str:
        return ACCELERATOR_NAME

    def get_device_stats(self, device: torch.device | str | int) -> dict[str, Any]:
        return torch.flagos.memory_stats(device)

    @classmethod
    def register_accelerators(cls, accelerator_registry: _AcceleratorRegistry) -> None:
        accelerator_registry.register(cls.name(), cls, description=cls.__name__, override=True)


def _on_flagos(plugin: Precision | None) -> Precision | None:
    """``plugin`` with its autocast on flagos. Lightning's connector makes ``MixedPrecision(precision,
    "cuda")`` for ``precision="16-mixed"``/``"bf16-mixed"`` with any accelerator but the CPU and MPS; on a
    flagos strategy that is the same precision on flagos (with a flagos GradScaler for 16-mixed, where the
    connector's is a CUDA one). Other plugins do not depend on the device and are kept."""
    if not isinstance(plugin, MixedPrecision) or plugin.device == DEVICE_TYPE:
        return plugin
    if plugin.device != "cuda":
        raise MisconfigurationException(
            f"A flagos strategy cannot autocast on '{plugin.device}': use MixedPrecision({plugin.precision!r}, "
            f"device='{DEVICE_TYPE}')"
        )
    scaler = torch.amp.GradScaler(DEVICE_TYPE) if plugin.precision == "16-mixed" else None
    return MixedPrecision(plugin.precision, DEVICE_TYPE, scaler)


class _FlagosPrecisionDevice:
    """The precision plugin of a flagos strategy autocasts on flagos (see :func:`_on_flagos`)."""

    @property
    def precision_plugin(self) -> Precision:
        return self._precision_plugin if self._precision_plugin is not None else Precision()

    @precision_plugin.setter
    def precision_plugin(self, precision_plugin: Precision | None) -> None:
        self._precision_plugin = _on_flagos(precision_plugin)


class SingleFlagosStrategy(_FlagosPrecisionDevice, SingleDeviceStrategy):
    """One flagos device, registered as ``"single_flagos"``: the one ``device`` names, else the one
    ``Trainer(devices=...)`` names (``devices=[1]``: flagos:1), which Lightning's connector hands over as
    ``parallel_devices``."""

    strategy_name = SINGLE_DEVICE_STRATEGY

    def __init__(self, device: torch.device | str | int | None = None, **kwargs: Any) -> None:
        if isinstance(device, int):
            device = torch.device(DEVICE_TYPE, device)
        super().__init__(device=torch.device(DEVICE_TYPE, 0) if device is None else device, **kwargs)
        self._parallel_devices = None if device is None else [self.root_device]

    @property
    def parallel_devices(self) -> list[torch.device] | None:
        return self._parallel_devices

    @parallel_devices.setter
    def parallel_devices(self, devices: list[torch.device]) -> None:
        if len(devices) != 1:
            raise MisconfigurationException(
                f"strategy='{SINGLE_DEVICE_STRATEGY}' runs on one device, but {len(devices)} were asked for: "
                f"use strategy='ddp_flagos'"
            )
        self._root_device = torch.device(devices[0])
        self._parallel_devices = [self._root_device]

    @classmethod
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        strategy_registry.register(cls.strategy_name, cls, description="one flagos device", override=True)


class DDPFlagosStrategy(_FlagosPrecisionDevice, DDPStrategy):
    """DistributedDataParallel over flagos devices, one process each, on the flagos c10d backend (the
    default for the device type), registered as ``"ddp_flagos"`` (Lightning starts the processes by running
    the script again) and ``"ddp_spawn_flagos"`` (``torch.multiprocessing.spawn``)."""

    strategy_name = "ddp_flagos"

    def determine_ddp_device_ids(self) -> list[int] | None:
        # DDP finds a single-device module's device itself; device ids would make Lightning build the DDP
        # wrapper under a torch.cuda.Stream.
        return None

    @classmethod
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        for name, start_method in DDP_STRATEGIES.items():
            strategy_registry.register(
                name,
                cls,
                description=f"DDP on flagos devices, processes started by {start_method}",
                override=True,
                start_method=start_method,
            )


def register() -> None:
    """Registers the accelerator and the strategies (done at import; registering again is harmless)."""
    FlagosAccelerator.register_accelerators(AcceleratorRegistry)
    SingleFlagosStrategy.register_strategies(StrategyRegistry)
    DDPFlagosStrategy.register_strategies(StrategyRegistry)


register()

__all__ = ["DDPFlagosStrategy", "FlagosAccelerator", "SingleFlagosStrategy", "register"]
