"""Launching a torchrun worker from a pytest test, bounded by a timeout
(test_torch_onebit.py, test_torch_zeroone_lamb.py): the worker's rank 0
prints one line ``RESULT <json>``, which launch() returns."""
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import lowbit


def launch(worker, nproc, case, seed, timeout, env=None):
    """Run `worker` under torchrun on `nproc` ranks with the arguments `case`
    and `seed` (and the variables `env` added to the environment); fail the
    test when it does not finish within `timeout` seconds (the workers are
    killed too), exits non-zero or prints no result."""
    torchrun = shutil.which("torchrun")
    cmd = ([torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"])
    cmd += ["--standalone", "--nproc-per-node", str(nproc), str(worker), case, str(seed % 100000)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [str(Path(lowbit.__file__).parents[1])] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
        **(env or {}))
    # its own session, so that a timeout kills the workers too, not only torchrun
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        stdout, stderr = p.communicate()
        pytest.fail(f"torchrun {case} on {nproc} ranks did not finish in {timeout} s:\n{stdout[-3000:]}\n"
                    f"{stderr[-3000:]}")
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert p.returncode == 0 and lines, f"torchrun {case} on {nproc} ranks failed (rc {p.returncode}):\n" \
        f"{stdout[-3000:]}\n{stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):])
