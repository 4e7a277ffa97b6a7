"""Record where the decode scheduler's time goes during a capacity run with the shared-prefix backend.

Starts the `on+shared` capacity PD pair (both servers --attention-backend sglang_pd_shared_prefix), runs
the capacity workload against it (bench_multiturn in attach mode, another process), and 2.5 s after the
workload starts samples the decode scheduler with py-spy for 6 s (250 Hz, raw collapsed stacks) into
docs/results/shared_prefix/profile/decode_scheduler.pyspy.txt.gz; then stops the pair (by its own PIDs). py-spy is not a
project dependency: `pip install --target /tmp/tools py-spy`, then

    PYSPY=/tmp/tools/bin/py-spy .venv/bin/python scripts/probes/shared_prefix/profile/record.py
    .venv/bin/python scripts/probes/shared_prefix/profile/summarise.py
"""

import gzip
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sglang_pd.bench.slo import SHARED_BACKEND
from sglang_pd.bench_multiturn import PRESETS
from sglang_pd.harness import DeploymentConfig, PDDeployment

OUT = Path(__file__).resolve().parents[4] / "docs" / "results" / "shared_prefix" / "profile"


def scheduler_pid(server_pid: int) -> int:
    """The `sglang::scheduler` child of a launch_server process."""
    out = subprocess.run(["pgrep", "-P", str(server_pid), "-f", "sglang::scheduler"], capture_output=True, text=True)
    pids = [int(p) for p in out.stdout.split()]
    if len(pids) != 1:
        raise RuntimeError(f"expected one scheduler under pid {server_pid}, found {pids}")
    return pids[0]


def main() -> int:
    pyspy = os.environ.get("PYSPY") or shutil.which("py-spy")
    if not pyspy:
        raise SystemExit("py-spy not found: set PYSPY (pip install --target /tmp/tools py-spy)")
    config = DeploymentConfig(decode_radix=True, decode_attention_backend=SHARED_BACKEND,
                              prefill_attention_backend=SHARED_BACKEND, **PRESETS["capacity"][1])
    with PDDeployment(config) as dep, tempfile.TemporaryDirectory() as out:
        workload = subprocess.Popen([sys.executable, "-m", "sglang_pd.bench_multiturn", "--preset", "capacity",
                                     "--prefill-url", dep.prefill.url, "--decode-url", dep.decodes[0].url,
                                     "--bootstrap-port", str(dep.bootstrap_port), "--label", "on+shared",
                                     "--no-progress", "--out-dir", out])
        time.sleep(2.5)
        raw = Path(out) / "decode_scheduler.pyspy.txt"
        subprocess.run([pyspy, "record", "-p", str(scheduler_pid(dep.decodes[0].proc.pid)), "-d", "6", "-r", "250",
                        "-f", "raw", "-o", str(raw), "--nonblocking"], check=True, capture_output=True)
        if workload.wait(timeout=600) != 0:
            raise RuntimeError(f"the workload exited with {workload.returncode}")
        with open(raw, "rb") as src, gzip.open(OUT / "decode_scheduler.pyspy.txt.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
    print(f"wrote {OUT / 'decode_scheduler.pyspy.txt.gz'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
