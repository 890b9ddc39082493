"""torch.distributed.checkpoint (DCP) of flagos state dicts: saved and loaded in one process without a
process group, and an FSDP2 checkpoint written by 2 ranks and loaded by 1 (checkpoints.py holds what each
rank runs).

DCP's FileSystemWriter with one writer thread (what dcp.save uses when given no writer) copies to the CPU
only tensors of the device type torch._utils._get_available_device_type() names, "cuda" wherever CUDA is
available. Backed by CUDA, flagos tensors then reach the file writer uncopied and it raises "Tensor must be
on CPU"; FileSystemWriter(path, thread_count=2) copies every tensor with .cpu() (docs/distributed.md)."""

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.utils._pytree import tree_flatten, tree_map

import torch_fl

BACKED = torch_fl._C._backing_type() == "cuda"
# The model's 6 tensors and Adam's 3 (step, exp_avg, exp_avg_sq) for each of them.
MLP_TENSORS = 6 + 6 * 3

WRITERS = {
    "default": lambda path: None,  # DCP's own: FileSystemWriter(path), one writer thread
    "threads": lambda path: FileSystemWriter(path, thread_count=2),
}


def flagos_state() -> dict:
    """A model's and its optimizer's state dicts, the tensors on flagos, after one Adam step."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 4).to("flagos")
        x = torch.randn(2, 8).to("flagos")
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(x).square().sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optim": opt.state_dict()}


# Without a process group DCP saves and loads as a single process, and says so.
NO_GROUP_WARNING = "ignore:torch.distributed is disabled, unavailable or uninitialized"


@pytest.mark.filterwarnings(NO_GROUP_WARNING)
@pytest.mark.parametrize("writer", WRITERS)
def test_round_trip_in_one_process(tmp_path, writer):
    if writer == "default" and BACKED:
        pytest.skip("backed by CUDA, DCP's own writer refuses flagos tensors (test_default_writer_backed)")
    state = flagos_state()
    dcp.save(state, checkpoint_id=tmp_path, storage_writer=WRITERS[writer](tmp_path))
    loaded = tree_map(lambda v: torch.zeros_like(v) if isinstance(v, torch.Tensor) else v, state)
    dcp.load(loaded, checkpoint_id=tmp_path)
    expected, spec = tree_flatten(state)
    actual, loaded_spec = tree_flatten(loaded)
    assert loaded_spec == spec
    for a, e in zip(actual, expected, strict=True):
        if isinstance(e, torch.Tensor):
            assert a.device == e.device and torch.equal(a.cpu(), e.cpu()), (a, e)
        else:
            assert a == e
    assert {t.device.type for t in loaded["model"].values()} == {"flagos"}


@pytest.mark.gpu
@pytest.mark.usefixtures("backed_by_cuda")
@pytest.mark.filterwarnings(NO_GROUP_WARNING)
def test_default_writer_backed(tmp_path):
    # torch's choice, not flagos's: when a torch lifts it, this fails, and docs/distributed.md's advice to
    # pass a writer for flagos checkpoints on CUDA machines can go.
    with pytest.raises(CheckpointException, match="Tensor must be on CPU"):
        dcp.save(flagos_state(), checkpoint_id=tmp_path)


def test_fsdp2_checkpoint_resharded_from_2_ranks_to_1(launch, tmp_path):
    # On the simulated accelerator DCP's own writer stages flagos tensors (no CUDA: flagos is the device
    # type it copies from).
    args = {"folder": str(tmp_path)}
    saved = launch("checkpoints", "save", 2, args={**args, "writer": "default"}, timeout=180).check()
    assert saved.results == [{"saved_by": 2}] * 2
    loaded = launch("checkpoints", "load", 1, args=args, timeout=180).check()
    assert loaded.results == [{"loaded_by": 1, "compared": MLP_TENSORS}]


@pytest.mark.gpu
def test_fsdp2_checkpoint_resharded_from_2_gpus_to_1(launch, tmp_path):
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    args = {"folder": str(tmp_path)}
    launch(
        "checkpoints", "save", 2, args={**args, "writer": "threads"}, accelerator="cuda", timeout=300
    ).check()
    loaded = launch("checkpoints", "load", 1, args=args, accelerator="cuda", timeout=300).check()
    assert loaded.results == [{"loaded_by": 1, "compared": MLP_TENSORS}]
