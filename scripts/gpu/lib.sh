# shellcheck shell=bash
# What the scripts of scripts/gpu/ share; sourced from the repository's root (they cd there first).
#
#   gpu_site              the wheels of .whl/ (scripts/gpu/wheels.sh) into $GPU_SITE, which goes on PYTHONPATH
#   gpu_build LOGDIR      a fresh build of this tree (pip install -e .), then the environment report
#   gpu_ctest             the C++ suites (HAL conformance, the core library's test), as scripts/test.sh runs them
#   left                  seconds until the deadline ($GPU_DEADLINE_S after the script started; 0: none)
#   run_limited LIMIT LOG COMMAND...   COMMAND in a process group of its own, stopped at LIMIT seconds
#   stop_groups           stops every process group run_limited started and that still runs
#   test_files            every test file of tests/, one a line, sorted

GPU_SITE=${GPU_SITE:-/tmp/site}
GPU_DEADLINE_S=${GPU_DEADLINE_S:-0}
export PYTHONUNBUFFERED=1

gpu_site() {
  if [ "${GPU_SKIP_INSTALL:-0}" != 1 ] && compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$GPU_SITE" \
      .whl/*.whl || { echo "error: pip install of .whl/*.whl into $GPU_SITE failed" >&2; return 1; }
  fi
  if [ -d "$GPU_SITE" ] && [[ ":${PYTHONPATH:-}:" != *":$GPU_SITE:"* ]]; then
    export PYTHONPATH=$GPU_SITE${PYTHONPATH:+:$PYTHONPATH}
  fi
  # Inductor compiles AOTInductor models with $CXX. The lent machine's CXX, /opt/gcc/bin/g++, builds models
  # that crash when created (torch's own cpu and cuda packages as well); its system g++ builds working ones.
  if [ "${CXX:-}" = /opt/gcc/bin/g++ ] && [ -x /usr/bin/g++ ]; then
    export CXX=/usr/bin/g++
  fi
  return 0
}

gpu_build() {
  local logs=$1 status
  rm -rf build
  { time python3 -m pip install -q --no-build-isolation --no-deps -e . ; } > "$logs/build.log" 2>&1
  status=$?
  tail -4 "$logs/build.log"
  [ $status -eq 0 ] || { echo "error: the build failed ($logs/build.log)"; tail -40 "$logs/build.log"; return 1; }
  python3 -m torch_fl > "$logs/report.log" 2>&1 || { cat "$logs/report.log"; return 1; }
}

gpu_ctest() {
  cmake -S tests/cpp/standalone -B build/hal-tests -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DFLAGOS_TEST_PYTHON="$(command -v python3)" &&
    cmake --build build/hal-tests &&
    ctest --test-dir build/hal-tests --output-on-failure
}

left() {
  if [ "$GPU_DEADLINE_S" -le 0 ]; then
    echo 86400
  else
    echo $((GPU_DEADLINE_S - SECONDS))
  fi
}

# The limit of a step: its own cap, or less where the deadline comes first.
limit_for() {
  local cap=$1 rest
  rest=$(left)
  echo $((cap < rest ? cap : rest))
}

# setsid makes COMMAND the leader of a new process group (and session): timeout signals that whole group at
# the limit (SIGTERM, SIGKILL 20 s later), and what COMMAND leaves behind in it (the clean processes of the
# model tests, say) is killed by the group's id once it returns (a background child is no group leader, so
# setsid does not fork: the id is $!). Exit status: COMMAND's, 124 or 137 when the limit stopped it, 125 when
# no time was left to start it. GPU_GROUPS_FILE (when set): where the groups' ids are noted for stop_groups.
run_limited() {
  local limit=$1 log=$2 pid status
  shift 2
  if [ "$limit" -le 0 ]; then
    echo "not started: no time left before the deadline" > "$log"
    return 125
  fi
  setsid timeout --kill-after=20 "$limit" "$@" > "$log" 2>&1 &
  pid=$!
  [ -n "${GPU_GROUPS_FILE:-}" ] && echo "$pid" >> "$GPU_GROUPS_FILE"
  wait "$pid"
  status=$?
  kill -KILL -- "-$pid" 2> /dev/null
  return $status
}

stop_groups() {
  local pid
  [ -f "${GPU_GROUPS_FILE:-}" ] || return 0
  while read -r pid; do
    kill -KILL -- "-$pid" 2> /dev/null
  done < "$GPU_GROUPS_FILE"
}

test_files() {
  find tests -name 'test_*.py' -type f | sort
}
