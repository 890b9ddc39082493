"""FlagGems under graph capture: which ops of a routing config can be captured with ``torch.flagos.graph``,
cold and after warm-up, and what stops the others.

For every op the config (default: the shipped ``torch_fl/configs/flaggems_cuda.conf``) routes to
``flaggems``, one call of it is audited on flagos with only that op routed to ``flaggems``:

1. The call: the OpInfo cases that passed the correctness sweep for the op (the config's comment on its
   route lists them; ``--map-in`` takes a sweep's ``flaggems_sweep.json`` instead), tried in order (the
   function, out=, in-place, backward), the first sample in one dtype (``--dtypes``: the first the
   sweep passed and the OpInfo supports). The sample runs with the op on the ``python`` backend, which
   records the op's arguments and runs the native kernel (FlagGems stays cold), as the sweep's discovery
   does; the first call of the op is the one audited, replayed as ``torch.ops.aten.<op>``.
2. Cold capture: the call captured with ``torch.flagos.graph`` without any earlier call of the op's
   FlagGems function in the process. Recorded: success or the error (the exception chain, where it was
   raised in FlagGems or Triton), whether the device is still usable afterwards (a worker whose context
   a failed capture broke ends, and the op's warm capture runs in a fresh worker; so does a random op's,
   whose eager calls would draw from a generator the failed capture left in capture mode), and later
   whether the cold graph's replay equals eager.
3. Warm capture: three eager calls on a side stream (as torch.cuda's graph docs advise; the FlagGems call
   counter confirms FlagGems ran; torch's CUDA sync debug mode counts host syncs per call), then a capture
   on that stream and two replays. Before each replay the inputs are reset and the outputs the graph
   allocated are overwritten (NaN, or values that differ from eager's), so a graph that does not
   compute them cannot pass; the replays' outputs (and the arguments in-place and out= calls change)
   are compared with the last eager call's bitwise (torch.equal; NaNs by their bits). Random ops are
   seeded before the eager call and the replay, and a third replay must draw other numbers. Where the
   warm capture fails after a failed cold capture, it is tried again in a fresh worker, so that a cold
   failure that breaks the process is told apart from an op that cannot be captured.

Per op: ``capturable-cold``, ``capturable-after-warmup``, ``not-capturable`` (with the error and a
diagnosis: autotuning, Triton compile or kernel load, host sync, device query, allocation, data-dependent
output size, host return value, random state frozen at capture, work not captured), ``fails-eager``,
``not-exercised`` (FlagGems' function never ran), ``crash`` (the worker died), ``timeout``
(``--op-timeout-s``), ``no-sample``, ``not-run`` (``--budget-s`` ran out). Transformer ops (those of a
Qwen3 forward, then harness.flaggems.PRIORITY_OPS) run first, so a budget cut leaves the least important ops.

Workers (``--workers`` processes) take ops one at a time from the parent. "Cold" is per op family: a
worker is given only ops whose family (the op's base name: ``add.Tensor``, ``add.out`` and ``add_.Tensor``
are one family, which shares FlagGems functions and Triton kernels) it has not run, and a worker with
none left is replaced by a fresh one. A worker in which a capture failed after ``capture_begin`` had
succeeded (cold or warm) reports that op's result and ends, and a fresh worker takes the next op: on torch
2.11 such a capture leaves the CUDA generator in capture mode, and every later random op in the process
(samples are drawn with random ops) would raise. Each worker first runs process-wide set-up that no op owns (a native
op, a native graph capture, a Triton kernel of its own: ``--no-process-warmup`` skips it), and gets its
own FlagGems cache directory (no autotuning results from earlier runs); Triton's on-disk cache is shared,
so "cold" may find a kernel compiled already (by another worker or run), but never loaded in the process.

Outputs in ``--out-dir``: ``capture_audit.json`` (everything; its header counts the workers ended after
a failed capture, ``workers_ended_after_failed_capture``) and ``capture_audit.md`` (the same count, a
table op | status | cold | warm | replay==eager | reason), and ``logs/worker-N.log`` (each worker's
stderr). Both
are rewritten every 15 s while it runs ("partial": true in the JSON), and SIGTERM (``timeout``) stops it
with its outputs written; ``--resume FILE`` audits only the ops an earlier run did not reach.

    python -m tools.flaggems_capture_audit --out-dir /tmp/capture
    python -m tools.flaggems_capture_audit --out-dir /tmp/c --ops aten::_softmax,aten::bmm --workers 2 -v

Needs an NVIDIA GPU, flagos on the cuda accelerator, FlagGems usable, and ``expecttest``. ``--stand-in``
runs it on the simulated accelerator with harness/fake_flaggems, a dry run of the pipeline on a machine
without a GPU; there no flaggems call can be captured (the python route reads its aliases as host memory,
a blocking copy the capture refuses), and ``--backend native`` checks the capture checks themselves.

This file is the command line and the parent (the workers' scheduling, the results' status, the report);
``tools/flaggems_capture_worker.py`` is what runs in a worker (one op's audit), and
``tools/flaggems_capture_ops.py`` what both use (the ops and their order, the config's OpInfo cases,
bitwise comparison, the diagnosis of a failed capture). A worker is this file run with ``--worker -``.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types

from harness.processes import REPO_ROOT, python_env
from tools import flaggems_common as common
from tools import flaggems_model_sweep as model_sweep
from tools.flaggems_capture_ops import (
    audit_order,
    config_cases,
    family,
    guessed_cases,
    ordered_cases,
)
from tools.flaggems_capture_worker import (
    CONTEXT_BROKEN_EXIT,
    PROTOCOL,
    must_end,
    run_worker,
)

STATUSES = (
    "capturable-cold",
    "capturable-after-warmup",
    "not-capturable",
    "fails-eager",
    "not-exercised",
    "crash",
    "timeout",
    "no-sample",
    "not-run",
)
CAPTURABLE = ("capturable-cold", "capturable-after-warmup")
DEFAULT_DTYPES = ("bfloat16", "float32")
SPAWN_MARGIN_S = 25  # no new worker this close to the budget's end (start-up alone takes 5-20 s)

# ---- the parent ------------------------------------------------------------------------------------------


class Worker:
    """A worker process, seen from the parent: what it was given, and what it said so far."""

    def __init__(self, index: int, command: list[str], log_dir: str, cache_root: str, events: queue.Queue):
        self.index = index
        self.log_path = os.path.join(log_dir, f"worker-{index}.log")
        # Only the audited op is ever routed to flaggems: no config or FLAGOS_OP_* routes of the caller's.
        env = python_env(
            {
                k: v
                for k, v in os.environ.items()
                if k != "FLAGOS_BACKEND_CONFIG" and not k.startswith("FLAGOS_OP_")
            }
        )
        # Its own FlagGems cache: no autotuning results of earlier runs or other workers ("cold"), and no
        # concurrent writers of one sqlite file.
        env["FLAGGEMS_CACHE_DIR"] = os.path.join(cache_root, f"flaggems_cache{index}")
        self.log = open(self.log_path, "w")  # noqa: SIM115  (closed when the worker ends)
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=env, text=True
        )
        self.ready = False
        self.stopping = False
        self.ended = False
        self.touched: set[str] = set()  # op families it has run
        self.item: dict | None = None
        self.began = 0.0
        self.phase = ""
        self.cold: dict | None = None
        threading.Thread(target=self._read, args=(events,), daemon=True).start()

    def _read(self, events: queue.Queue) -> None:
        for line in self.proc.stdout:
            if line.startswith(PROTOCOL):
                try:
                    events.put((self, json.loads(line[len(PROTOCOL) :])))
                except json.JSONDecodeError:
                    pass
        events.put((self, None))

    def send(self, record: dict) -> None:
        try:
            self.proc.stdin.write(json.dumps(record) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    def assign(self, item: dict) -> None:
        item = {**item, "ops_before": len(self.touched)}  # earlier ops (other families) in this process
        self.item, self.began, self.phase, self.cold = item, time.time(), "start", None
        self.touched.add(family(item["op"]))
        self.send(item)

    def stop(self) -> None:
        self.stopping = True
        self.send({"stop": True})

    def kill(self) -> None:
        self.stopping = True
        if self.proc.poll() is None:
            self.proc.kill()

    def log_tail(self, lines: int = 6) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                tail = [line.rstrip() for line in f.readlines()[-lines:]]
        except OSError:
            return ""
        return " | ".join(line for line in tail if line)[-500:]


def classify(result: dict) -> dict:
    """Sets status and reason from the cold and warm records (the parent's: after a retry's merge)."""
    if result.get("status") in ("no-sample", "crash", "timeout", "not-run"):
        return result
    cold, warm = result.get("cold") or {}, result.get("warm") or {}
    if not warm:
        why = result.get("retry_warm", "")
        result.update(status="not-run", reason=f"no warm capture: {why}; no fresh worker in the budget")
    elif not warm.get("eager_ok"):
        result.update(status="fails-eager", reason=warm.get("eager_error", ""))
    elif not warm.get("flaggems_calls"):
        result.update(status="not-exercised", reason="FlagGems' function did not run in the eager calls")
    elif warm.get("captured") and warm.get("replay_ok"):
        if cold.get("captured") and cold.get("replay_ok"):
            result.update(status="capturable-cold", reason="")
        elif cold.get("captured"):
            why = cold.get("replay_message") or "not replayed"
            result.update(status="capturable-after-warmup", reason=f"cold capture's replay: {why}")
        elif cold:
            result.update(
                status="capturable-after-warmup", reason=f"cold: {cold['diagnosis']}: {cold['error']}"
            )
        else:
            result.update(status="capturable-after-warmup", reason="cold capture not run")
        if not warm.get("replay_equal"):
            result["reason"] += "; eager differs between calls, the replay is within the sweep's tolerance"
    elif warm.get("captured"):
        result.update(status="not-capturable", reason=f"replay: {warm.get('replay_message')}")
    else:
        result.update(status="not-capturable", reason=f"{warm.get('diagnosis')}: {warm.get('error')}")
    if result.get("retried"):
        result["reason"] += f" (warm capture retried in a fresh worker: {result['retried']})"
    elif result.get("retry_warm") and warm:
        result["reason"] += f" ({result['retry_warm']}; not retried in a fresh worker: no time left)"
    result["reason"] = result["reason"][:500]
    return result


def merge_retry(first: dict, retry: dict) -> dict:
    """The first attempt's cold capture with the warm capture of the fresh worker."""
    merged = {**first, **{k: v for k, v in retry.items() if k not in ("cold", "status", "reason")}}
    merged["first_warm"] = first.get("warm")
    merged["retried"] = first.get("retry_warm", "")
    if retry.get("status") in ("crash", "timeout", "no-sample", "not-run"):
        merged["status"], merged["reason"] = retry["status"], retry.get("reason", "")
    else:
        merged.pop("status", None)
    merged.pop("retry_warm", None)
    return merged


def cell_cold(r) -> str:
    cold = getattr(r, "cold", None) or {}
    if not cold:
        return ""
    if cold.get("captured"):
        if "replay_ok" not in cold:
            return "captured (not replayed)"
        return "ok" if cold["replay_ok"] else f"captured, replay: {cold.get('replay_message', '')}"[:80]
    return f"fails: {cold.get('diagnosis', '')}"[:80] + (
        "" if cold.get("context_ok", True) else " (context lost)"
    )


def cell_warm(r) -> str:
    warm = getattr(r, "warm", None) or {}
    if not warm or not warm.get("eager_ok"):
        return ""
    if warm.get("captured"):
        return "ok" if warm.get("replay_ok") else "captured"
    return f"fails: {warm.get('diagnosis', '')}"[:80]


def cell_replay(r) -> str:
    cells = []
    for name in ("warm", "cold"):
        record = getattr(r, name, None) or {}
        if "replay_equal" in record and record["replay_equal"] is not None:
            cells.append(
                f"{name}: {'equal' if record['replay_equal'] else record.get('replay_message', '')[:60]}"
            )
    return "; ".join(cells)


def write_markdown(path: str, results: dict[str, dict], header: dict) -> None:
    intro = (
        f"Capture audit of `{header['config']}`: {header['environment']}, {header['date']}; one call per op "
        f"({', '.join(header['dtypes'])}), {header['warmup']} eager calls before the warm capture; "
        f"{header['seconds']:.0f} s; {header.get('workers_ended_after_failed_capture', 0)} workers ended "
        "after a capture failed in them, fresh ones taking the ops left (torch 2.11 leaves the CUDA generator "
        "in capture mode)."
    )
    rows = {op: types.SimpleNamespace(**r) for op, r in results.items()}
    common.write_status_markdown(
        path,
        intro,
        STATUSES,
        rows,
        ["cold", "warm", "replay==eager", "reason"],
        lambda r: [cell_cold(r), cell_warm(r), cell_replay(r), (r.reason or "")[:200]],
    )


def run_parent(args, items: list[dict], log, start: float, checkpoint, stats: dict) -> dict[str, dict]:
    """Hands `items` to up to ``args.workers`` workers, one op at a time (each to a worker that has not run
    its family); returns op -> result. ``checkpoint(results)`` is called every 15 s with the results so far
    (outputs that survive a kill). SIGTERM (``timeout``) ends the run early, its outputs written.

    A worker whose op result must end it (``must_end``: its device context is gone, or a capture failed in
    it after capture_begin, ``replace_worker``) gets no more work and exits by itself; the loop below then
    starts a fresh worker (its own FlagGems cache, the same environment) for the ops left, within the
    budget. ``stats["workers_ended_after_failed_capture"]`` counts those ended by ``replace_worker``."""
    command = [
        sys.executable,
        "-m",
        "tools.flaggems_capture_audit",
        "--worker",
        "-",
        "--sample-timeout",
        str(args.sample_timeout),
    ]
    command += ["--warmup", str(args.warmup), "--backend", args.backend]
    command += ["--stand-in"] * args.stand_in + ["--no-process-warmup"] * args.no_process_warmup
    log_dir = os.path.join(args.out_dir, "logs")
    os.makedirs(log_dir, exist_ok=True)
    cache_root = tempfile.mkdtemp(prefix="flaggems_capture_audit_")
    deadline = start + args.budget_s
    events: queue.Queue = queue.Queue()
    pending = list(items)
    results: dict[str, dict] = {}
    workers: list[Worker] = []
    first_attempts: dict[str, dict] = {}  # op -> its first result, while its warm capture is retried
    startup_failures = 0
    terminated = []
    last_checkpoint = time.time()
    signal.signal(signal.SIGTERM, lambda signum, frame: terminated.append(signum))

    def finish(worker: Worker, item: dict, result: dict) -> None:
        op = item["op"]
        if op in first_attempts:
            result = merge_retry(first_attempts.pop(op), result)
        elif result.get("retry_warm") and time.time() < deadline - 10:
            first_attempts[op] = result
            pending.insert(0, {k: v for k, v in item.items() if k != "ops_before"} | {"skip_cold": True})
            return
        result = classify(result)
        result.pop("exit", None)
        result.update(worker=worker.index, ops_before_in_worker=item.get("ops_before"))
        results[op] = result
        if args.verbose:
            log(f"{op}: {result['status']} {result.get('reason', '')}"[:300])

    def give_work(worker: Worker) -> None:
        if time.time() < deadline:
            for i, item in enumerate(pending):
                if family(item["op"]) not in worker.touched:
                    worker.assign(pending.pop(i))
                    return
        worker.stop()  # nothing it can run cold (a fresh worker takes over) or no time left

    def lose(worker: Worker, status: str, why: str) -> None:
        item, worker.item = worker.item, None
        if item is not None:
            result = {"op": item["op"], "family": family(item["op"]), "status": status, "reason": why[:500]}
            if worker.cold is not None:
                result["cold"] = worker.cold
            finish(worker, result=result, item=item)

    while True:
        now = time.time()
        if terminated:
            log("terminated (SIGTERM): the running ops are stopped, the outputs written")
            for w in workers:
                if w.item is not None and not w.ended:
                    w.kill()
                    lose(w, "not-run", f"the run was terminated while it ran (phase {w.phase})")
            break
        if now - last_checkpoint > 15:
            checkpoint(results)
            last_checkpoint = now
        live = [w for w in workers if not w.ended]
        if not any(w.item is not None for w in live) and (not pending or now >= deadline):
            break
        active = [w for w in live if not w.stopping]
        waiting = [w for w in active if w.item is None]  # starting, or ready and about to be given work
        if now < deadline - SPAWN_MARGIN_S and startup_failures < 3:
            for _ in range(min(args.workers - len(active), len(pending) - len(waiting))):
                workers.append(Worker(len(workers), command, log_dir, cache_root, events))
        elif not live:
            break
        try:
            worker, record = events.get(timeout=0.5)
        except queue.Empty:
            worker, record = None, None
        if worker is not None and record is None:  # its stdout closed: the worker ended
            worker.ended = True
            code = worker.proc.wait()
            if not worker.ready and not terminated:
                startup_failures += 1
                log(f"worker {worker.index} ended before it was ready (exit {code}): {worker.log_tail()}")
            if worker.item is not None:
                why = "a CUDA error" if code == CONTEXT_BROKEN_EXIT else f"exit status {code}"
                lose(
                    worker, "crash", f"the worker died ({why}) in phase {worker.phase}: {worker.log_tail(3)}"
                )
            worker.log.close()
        elif worker is not None:
            if "fatal" in record:
                log(f"worker {worker.index}: {record['fatal']}")
            elif "ready" in record:
                worker.ready = True
                if worker.index == 0 or args.verbose:
                    log(
                        f"worker {worker.index} ready in {record['startup_s']} s; "
                        f"process set-up {record['process_warmup']}"
                    )
                give_work(worker)
            elif "phase" in record:
                worker.phase = record["phase"]
            elif "partial" in record:
                worker.cold = record["cold"]
            elif "result" in record and worker.item is not None:
                item, worker.item = worker.item, None
                ends = must_end(record["result"])
                if record["result"].get("replace_worker") and not record["result"].get("exit"):
                    stats["workers_ended_after_failed_capture"] += 1
                    if args.verbose:
                        log(
                            f"worker {worker.index} ends after {item['op']}: {record['result']['replace_worker']}"
                        )
                finish(worker, item, record["result"])
                if ends:
                    worker.stop()  # it ends by itself (device context unusable, or a failed capture)
                else:
                    give_work(worker)
        now = time.time()
        for w in workers:
            if w.item is None or w.ended:
                continue
            if now > deadline + args.grace_s:
                w.kill()
                lose(w, "not-run", f"the budget ran out while it ran (phase {w.phase})")
            elif now - w.began > args.op_timeout_s:
                w.kill()
                lose(w, "timeout", f"no result after {args.op_timeout_s:g} s (phase {w.phase})")
    for w in workers:
        if w.ended:
            continue
        if w.ready:
            w.stop()
        else:
            w.kill()  # still starting: nothing to wait for
    for w in workers:
        try:
            w.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            w.kill()
            w.proc.wait()
    for op, first in first_attempts.items():  # retries the budget did not reach
        first.pop("exit", None)
        results.setdefault(op, classify(first))
    for item in pending:
        if item["op"] not in results:
            reason = "the time budget ran out before it"
            if terminated:
                reason = "the run was terminated (SIGTERM) before it"
            elif startup_failures >= 3:
                reason = f"no worker could start (see {log_dir})"
            results[item["op"]] = {
                "op": item["op"],
                "family": family(item["op"]),
                "status": "not-run",
                "reason": reason,
            }
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out-dir", default="flaggems_capture_audit_out")
    parser.add_argument(
        "--config",
        help="routing config whose flaggems routes to audit (default: the shipped flaggems_cuda.conf)",
    )
    parser.add_argument(
        "--ops", default="", help="comma-separated ops (default: every op the config routes to flaggems)"
    )
    parser.add_argument(
        "--map-in",
        help="a sweep's flaggems_sweep.json: its op -> OpInfo cases map (default: the config's comments)",
    )
    parser.add_argument(
        "--dtypes", default=",".join(DEFAULT_DTYPES), help="preferred dtypes, first that the sweep passed"
    )
    parser.add_argument("--warmup", type=int, default=3, help="eager calls before the warm capture")
    parser.add_argument("--workers", type=int, default=max(1, min(12, (os.cpu_count() or 2) - 4)))
    parser.add_argument(
        "--budget-s", type=float, default=210.0, help="wall time for everything, start-up included"
    )
    parser.add_argument(
        "--grace-s", type=float, default=15.0, help="after the budget, before running ops are killed"
    )
    parser.add_argument("--op-timeout-s", type=float, default=90.0, help="one op's limit in a worker")
    parser.add_argument("--sample-timeout", type=float, default=30.0)
    parser.add_argument("--resume", help="an earlier capture_audit.json: audit only the ops it did not run")
    parser.add_argument("--no-process-warmup", action="store_true", help="no process-wide set-up in workers")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument(
        "--backend", default="flaggems", choices=("flaggems", "native"), help=argparse.SUPPRESS
    )
    common.add_worker_arguments(parser)
    args = parser.parse_args(argv)
    if args.worker:
        return run_worker(args)

    start = time.time()

    def log(message: str) -> None:
        print(f"flaggems_capture_audit [{time.time() - start:.0f} s]: {message}", flush=True)

    reason = common.check_environment(stand_in=args.stand_in)
    if reason:
        print(f"flaggems_capture_audit: cannot run here: {reason}", file=sys.stderr)
        return 2
    from torch_fl import _flaggems, routing

    config = args.config or routing.package_config("flaggems_cuda")
    configured = model_sweep.candidate_ops(config)
    routable = set(_flaggems.routable_ops())
    wanted = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = [o for o in wanted if o not in routable]
    if unknown:
        parser.error(f"not routable FlagGems ops here: {', '.join(unknown)}")
    ops = wanted or [op for op in configured if op in routable]
    left_out = sorted(set(configured) - routable) if not wanted else []
    if args.map_in:
        with open(args.map_in) as f:
            opinfo_map = json.load(f)
        opinfo_map = opinfo_map.get("opinfo_map", opinfo_map)
        cases = {op: {"dtypes": [], "cases": keys} for op, keys in opinfo_map.items()}
    else:
        cases = config_cases(config)
    earlier: dict[str, dict] = {}
    if args.resume:
        with open(args.resume) as f:
            earlier = {r["op"]: r for r in json.load(f)["results"] if r["status"] != "not-run"}
    preferred = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    items = []
    for op in audit_order([op for op in ops if op not in earlier]):
        known = cases.get(op, {})
        passed = known.get("dtypes") or preferred
        dtypes = [d for d in preferred if d in passed] + [d for d in passed if d not in preferred]
        items.append(
            {"op": op, "cases": ordered_cases(known.get("cases") or guessed_cases(op)), "dtypes": dtypes}
        )
    os.makedirs(args.out_dir, exist_ok=True)
    log(
        f"{common.environment_line()}; {len(items)} ops of {config}, {args.workers} workers, "
        f"budget {args.budget_s:.0f} s"
        + (f"; {len(left_out)} configured ops not routable here" if left_out else "")
    )

    def write(results: dict[str, dict], final: bool) -> dict[str, dict]:
        header = {
            "environment": common.environment_line(),
            "date": datetime.date.today().isoformat(),
            "config": os.path.relpath(config, REPO_ROOT) if config.startswith(REPO_ROOT) else config,
            "dtypes": preferred,
            "warmup": args.warmup,
            "workers": args.workers,
            "budget_s": args.budget_s,
            "seconds": time.time() - start,
            "not_routable_here": left_out,
            **stats,  # workers_ended_after_failed_capture
            "partial": not final,
        }
        ordered = {op: results[op] for op in audit_order(list(results))}
        with open(os.path.join(args.out_dir, "capture_audit.json"), "w") as f:
            json.dump({**header, "results": list(ordered.values())}, f, indent=1, default=str)
        write_markdown(os.path.join(args.out_dir, "capture_audit.md"), ordered, header)
        return ordered

    stats = {"workers_ended_after_failed_capture": 0}  # run_parent counts them
    checkpoint = lambda r: write({**earlier, **r}, False)  # noqa: E731
    ordered = write({**earlier, **run_parent(args, items, log, start, checkpoint, stats)}, True)
    elapsed = time.time() - start
    counts = collections.Counter(r["status"] for r in ordered.values())
    log(f"{dict(counts)} in {elapsed:.0f} s; outputs in {args.out_dir}")
    log(f"  {stats['workers_ended_after_failed_capture']} workers ended after a failed capture")
    diagnoses = collections.Counter(
        (r.get("warm") or {}).get("diagnosis") or r.get("reason", "")[:60]
        for r in ordered.values()
        if r["status"] == "not-capturable"
    )
    for why, n in diagnoses.most_common():
        log(f"  not capturable after warm-up, {n} ops: {why}")
    cold = collections.Counter(
        (r.get("cold") or {}).get("diagnosis")
        for r in ordered.values()
        if r["status"] == "capturable-after-warmup"
    )
    for why, n in cold.most_common():
        log(f"  capturable after warm-up only, {n} ops; cold: {why}")
    for r in ordered.values():
        if r["status"] not in CAPTURABLE and r["status"] != "not-run":
            log(f"  {r['op']}: {r['status']}: {r.get('reason', '')}"[:240])
    return 0


if __name__ == "__main__":
    sys.exit(main())
