"""The gdb side of tools/count_op_path.py: sourced by gdb (``gdb -batch -x``), never imported by Python.

It runs the inferior command, waits for the inferior's first SIGUSR1 (sent after the warm-up ops), puts a
breakpoint on the first instruction of every function whose debug information places its definition
under COUNT_OP_PATH_SOURCES (the project's csrc/), counting each hit without stopping, and removes them at
the second SIGUSR1 (sent after the measured op). The hits go, as JSON, to COUNT_OP_PATH_OUT:
``{"functions": [{"name", "file", "line", "entries", "other_threads"}, ...], "order": [[index, main?]...]}``
(``order``: the entries in the order they happened, as indices into ``functions``).

Environment: COUNT_OP_PATH_SOURCES, COUNT_OP_PATH_OUT, COUNT_OP_PATH_LIBS (colon-separated paths of the
shared libraries whose functions are candidates: nm lists their symbols).
"""

import json
import os
import subprocess

import gdb  # noqa: F401  (provided by gdb)

SOURCES = os.path.realpath(os.environ["COUNT_OP_PATH_SOURCES"]) + os.sep
OUT = os.environ["COUNT_OP_PATH_OUT"]
LIBS = [os.path.realpath(p) for p in os.environ["COUNT_OP_PATH_LIBS"].split(":") if p]

FUNCTIONS = []  # {"name", "file", "line", "entries", "other_threads"}
ORDER = []  # (function index, on the thread that sent the signal)
STATE = {"main_thread": None}
BREAKPOINTS = []


class CountingBreakpoint(gdb.Breakpoint):
    def __init__(self, pc, index):
        super().__init__(f"*{pc:#x}", internal=True)
        self.index = index

    def stop(self):
        record = FUNCTIONS[self.index]
        on_main = gdb.selected_thread().num == STATE["main_thread"]
        record["entries"] += 1
        if not on_main:
            record["other_threads"] += 1
        ORDER.append((self.index, on_main))
        return False


def load_bases(pid):
    """Path -> load address (the start of its mapping at file offset 0) of each library in LIBS."""
    bases = {}
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            parts = line.split()
            if len(parts) < 6 or int(parts[2], 16) != 0:
                continue
            path = os.path.realpath(parts[5]) if os.path.exists(parts[5]) else parts[5]
            if path in LIBS and path not in bases:
                bases[path] = int(parts[0].split("-")[0], 16)
    return bases


def text_symbols(path):
    """(address, demangled name) of each defined function symbol of the library, one per address."""
    out = subprocess.run(
        ["nm", "--defined-only", "-C", path], check=True, capture_output=True, text=True
    ).stdout
    seen = {}
    for line in out.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[1] in ("t", "T", "W", "w", "i"):
            seen.setdefault(int(parts[0], 16), parts[2])
    return sorted(seen.items())


def set_breakpoints():
    pid = gdb.selected_inferior().pid
    bases = load_bases(pid)
    missing = [p for p in LIBS if p not in bases]
    if missing:
        raise gdb.GdbError(f"count_op_path: not loaded in the inferior: {missing}")
    for path, base in bases.items():
        for address, name in text_symbols(path):
            pc = base + address
            sal = gdb.find_pc_line(pc)
            if sal.symtab is None:
                continue
            file = os.path.realpath(sal.symtab.fullname())
            if not file.startswith(SOURCES):
                continue
            FUNCTIONS.append(
                {
                    "name": name,
                    "file": file[len(SOURCES) :],
                    "line": sal.line,
                    "entries": 0,
                    "other_threads": 0,
                }
            )
            BREAKPOINTS.append(CountingBreakpoint(pc, len(FUNCTIONS) - 1))


def stopped_by_sigusr1():
    try:
        return gdb.parse_and_eval("$_siginfo.si_signo") == 10
    except gdb.error:
        return False


gdb.execute("set pagination off")
gdb.execute("set confirm off")
gdb.execute("handle SIGUSR1 stop print nopass")
gdb.execute("run", to_string=True)
if not stopped_by_sigusr1():
    raise gdb.GdbError("count_op_path: the inferior ended before its warm-up signal")
STATE["main_thread"] = gdb.selected_thread().num
set_breakpoints()
gdb.execute("continue", to_string=True)
if not stopped_by_sigusr1():
    raise gdb.GdbError("count_op_path: the inferior ended before its end-of-op signal")
for bp in BREAKPOINTS:
    bp.delete()
with open(OUT, "w") as f:
    json.dump({"functions": FUNCTIONS, "order": ORDER}, f)
gdb.execute("continue", to_string=True)
