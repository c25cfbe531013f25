#!/usr/bin/env bash
# Sourced by the GPU scripts (gpu_check.sh, foreign_code.sh): install racecheck into the machine's
# Python without touching its torch, once per machine. The wheels it lacks (pytest-repeat, tqdm,
# psutil, megatron-fsdp, mypy to compile the detector's engine, see gpu_check.sh's header) travel
# in .whl/ and go to /tmp/site. A second script started while the first installs waits for it
# (flock), then finds the stamp and skips: two editable installs at once would rebuild the
# compiled engine under a running run.
#   source bench/gpu_install.sh LOGFILE   (exports PYTHONPATH; returns 3 when the install fails)
# A helper of the GPU scripts: it makes no report of its own.
gpu_install() {
  local log=$1 stamp=/tmp/racecheck-gpu-install.done
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  (
    if command -v flock >/dev/null; then flock 9; fi
    [ -e "$stamp" ] && exit 0
    if ls .whl/*.whl >/dev/null 2>&1; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
    fi
    python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >"$log" 2>&1 || { tail -5 "$log"; exit 3; }
    touch "$stamp"
  ) 9>/tmp/racecheck-gpu-install.lock
}
