"""Processes of the harness: the environment of the ones it starts, functions run in a clean process, and
two processes' timed steps taken in turns.

A function runs in a clean process (``run_in_clean_process``) when the process that wants its result cannot
run it: a CUDA backward cannot run once torch_fl is imported (``backward_runs_here``), and a first call that
should pay its compilation must start cold. The child is ``python -m harness._clean_process_main``: it
imports the function by its ``"module:function"`` name, the usual way, and imports torch_fl only when asked.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def python_env(env: dict | None = None, *, first: tuple[str, ...] = ()) -> dict:
    """``env`` (default: this process's environment) with ``first`` and then the repository's root in front
    of ``PYTHONPATH``: what a Python process started from the tests, benchmarks or tools needs to import
    ``harness``, ``benchmarks``, ``tools`` and ``examples`` whatever its working directory."""
    env = dict(os.environ if env is None else env)
    entries = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    entries = [*first, REPO_ROOT, *(p for p in entries if p not in (*first, REPO_ROOT))]
    env["PYTHONPATH"] = os.pathsep.join(entries)
    return env


def let_autograd_threads_finish() -> None:
    """Lets torch's autograd device threads drop their last graph task before the interpreter exits.

    On torch 2.13 a backward pass on a non-CPU device leaves the device's autograd thread holding a
    Python object (the graph task's saved ``contextvars`` context) that it releases once it next gets
    the GIL; if the process exits first, that thread is killed inside a C++ destructor and the process
    aborts ("terminate called without an active exception", exit code 134). Entry points that end soon
    after a backward call this; sleeping releases the GIL for it."""
    time.sleep(0.05)


def backward_runs_here(device: str) -> bool:
    """Whether a backward pass on ``device`` can run in this process.

    Not on ``cuda`` once torch_fl is imported: registering flagos as PyTorch's PrivateUse1 backend makes it
    torch's one accelerator (``torch.accelerator.current_accelerator()``), and torch's autograd engine
    then finds no stream for autograd nodes on CUDA tensors and fails every CUDA backward with an internal
    assert (``opt_ready_stream && opt_parent_stream``, engine.cpp; pytorch/pytorch#161129, a fix declined
    upstream). Backward on flagos tensors is unaffected. So the CUDA reference trains in a process of its
    own (run_in_clean_process)."""
    import torch

    if torch.device(device).type != "cuda":
        return True
    accelerator = torch.accelerator.current_accelerator()
    return accelerator is None or accelerator.type == "cuda"


def run_in_clean_process(
    function: str,
    master: dict | None = None,
    *,
    env: dict | None = None,
    with_torch_fl: bool = False,
    timeout: float | None = None,
    **kwargs,
):
    """``function(**kwargs)`` run in a fresh Python process that never imports torch_fl, so that CUDA
    backward works there (see backward_runs_here); with ``with_torch_fl``, a fresh process that does (for
    flagos runs that must start cold). ``function`` names it as ``"module:function"``. With ``master``
    (``harness.qwen3.build_model``'s arguments), the model it builds is the function's first argument.

    Arguments and the result cross as ``torch.save`` files (plain data and tensors only), in /dev/shm
    where there is one. ``env`` adds environment variables for the child. The child's output goes to this
    process's stderr. A failure raises RuntimeError with the child's exit code and traceback, and so does a
    child still running after ``timeout`` seconds (it is killed)."""
    import torch

    module, _, name = function.partition(":")
    if not module or not name:
        raise ValueError(f"run_in_clean_process names a function as 'module:function', got {function!r}")
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="harness_clean_process_", dir=shm) as tmp:
        request, result, error = (os.path.join(tmp, f) for f in ("request.pt", "result.pt", "error.txt"))
        torch.save({"function": function, "master": master, "kwargs": kwargs}, request)
        command = [sys.executable, "-m", "harness._clean_process_main", request, result, error]
        command.append("1" if with_torch_fl else "0")
        child_env = python_env({**os.environ, **(env or {})})
        with subprocess.Popen(command, stdout=sys.stderr, env=child_env) as proc:
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise RuntimeError(
                    f"{function} in a clean process did not finish within {timeout} s"
                ) from None
            except BaseException:
                proc.kill()
                raise
        if proc.returncode != 0:
            traceback = open(error).read() if os.path.exists(error) else ""
            raise RuntimeError(
                f"{function} in a clean process failed with exit code {proc.returncode}"
                + (f"; the child's traceback:\n{traceback}" if traceback else "")
            )
        return torch.load(result, weights_only=False)


class Turns:
    """The timed steps of two processes run at the same time (benchmarks/qwen3.py and
    benchmarks/distributed.py with --side-by-side), taken in turns: once both finished their warm-up
    (compilation, the first steps), blocks of ``block`` steps alternate between them in the order ABBA
    (0 1 1 0 0 1 ...), so that only one process runs at a time, on the same GPU and CPUs, and the machine's
    drift hits both alike. They hand over through files in ``folder``: ``ready-<me>``, ``done-<turn>``;
    ``abort`` (written by the parent when the other failed) ends the wait. A launch of several ranks is one
    side: each of its ranks waits, and only the one with ``marks`` writes its side's files."""

    BLOCK = 5

    def __init__(
        self, folder: str, me: int, block: int = BLOCK, timeout_s: float = 3600.0, marks: bool = True
    ):
        self.folder, self.me, self.block, self.timeout_s, self.marks = folder, me, block, timeout_s, marks

    @staticmethod
    def owner(turn: int) -> int:
        return turn % 2 if (turn // 2) % 2 == 0 else 1 - turn % 2

    @staticmethod
    def block_pairs(ref: list[float], fl: list[float], block: int = BLOCK) -> list[float]:
        """Ratios of two sides' block medians, block by block: the i-th blocks of the two sides ran one
        right after the other."""
        n = min(len(ref), len(fl)) // block
        return [
            statistics.median(fl[i * block : (i + 1) * block])
            / statistics.median(ref[i * block : (i + 1) * block])
            for i in range(n)
        ]

    def _mark(self, name: str) -> None:
        if self.marks:
            open(os.path.join(self.folder, name), "w").close()

    def _wait(self, name: str) -> None:
        path, abort = os.path.join(self.folder, name), os.path.join(self.folder, "abort")
        deadline = time.monotonic() + self.timeout_s
        while not os.path.exists(path):
            if os.path.exists(abort) or time.monotonic() > deadline:
                raise RuntimeError(f"taking turns: the other side never got to {name!r}")
            time.sleep(0.002)

    def take(self, timed_step, repeats: int) -> list:
        """``timed_step()``'s results for at least ``repeats`` steps (whole blocks), in this side's turns."""
        self._mark(f"ready-{self.me}")
        self._wait(f"ready-{1 - self.me}")
        results = []
        blocks = -(-repeats // self.block)
        for turn in range(2 * blocks):
            if self.owner(turn) != self.me:
                continue
            if turn > 0 and self.owner(turn - 1) != self.me:
                self._wait(f"done-{turn - 1}")
            results += [timed_step() for _ in range(self.block)]
            self._mark(f"done-{turn}")
        return results
