"""Benchmark: the orchestrator's memory while a sandbox floods its output, against raw docker SDK.

Each row runs in its own process, so its peak RSS (from wait4) is that consumer's alone:
- ours: `sandbox call exec` of a command printing SIZE bytes (bounded capture, spilled to disk);
- raw streamed: docker SDK `exec_run(stream=True)` reading and discarding every chunk (the floor);
- raw buffered: docker SDK `exec_run()` returning the whole output (what naive code does), on a
  quarter of SIZE so the machine survives it.
Run: python bench/output.py [SIZE_MIB]   (default 2048; needs the engine and `sandbox images build`)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "sandbox-exec:latest"

RAW = f"""
import docker, sys
size, mode = int(sys.argv[1]), sys.argv[2]
client = docker.from_env()
c = client.containers.run("{IMAGE}", ["sleep", "600"], detach=True, labels={{"io.agent-sandbox.bench": "1"}})
try:
    cmd = ["sh", "-c", f"head -c {{size}} /dev/zero | tr '\\\\0' x"]
    if mode == "stream":
        total = sum(len(chunk) for chunk in c.exec_run(cmd, stream=True).output)
    else:
        total = len(c.exec_run(cmd).output)
    print(total)
finally:
    c.remove(force=True)
"""


def measured(argv: list[str]) -> tuple[float, float, str]:
    """(peak RSS MiB, wall seconds, stdout) of one child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT)
    assert proc.stdout is not None
    out = proc.stdout.read().decode()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    proc.stdout.close()
    return usage.ru_maxrss / 1024, time.perf_counter() - start, out


def main() -> None:
    size = int(sys.argv[1]) * 1024 * 1024 if len(sys.argv) > 1 else 2048 * 1024 * 1024
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "c.yaml"
        config.write_text(
            json.dumps(
                {
                    "state_dir": f"{tmp}/state",
                    "instance": "benchout",
                    "tools": {"exec": {"max_output_bytes": size * 2}},
                    "agents": {"defaults": {"sandbox": {"mode": "all", "scope": "agent"}}},
                }
            )
        )
        cmd = f"head -c {size} /dev/zero | tr '\\0' x"
        ours = measured(
            [
                sys.executable,
                "-m",
                "sandbox",
                "--config",
                str(config),
                "call",
                "--session",
                "flood",
                "exec",
                json.dumps({"command": cmd, "timeout_s": 900}),
                "--json",
            ]
        )
        result = json.loads(ours[2])
        assert result["ok"], result
        subprocess.run(
            [sys.executable, "-m", "sandbox", "--config", str(config), "recreate", "--all"],
            cwd=ROOT,
            capture_output=True,
            check=False,
        )
        streamed = measured([sys.executable, "-c", RAW, str(size), "stream"])
        buffered = measured([sys.executable, "-c", RAW, str(size // 4), "buffer"])
    mib = size / 2**20
    print(f"{'consumer':<46}{'output MiB':>11}{'peak RSS MiB':>14}{'wall s':>9}{'RSS ratio':>11}")
    rows = [
        ("sandbox call exec (bounded capture)", mib, ours),
        ("raw exec_run(stream=True), discarding", mib, streamed),
        ("raw exec_run(), buffered (1/4 of the output)", mib / 4, buffered),
    ]
    for name, out_mib, (rss, wall, _) in rows:
        print(f"{name:<46}{out_mib:>11.0f}{rss:>14.1f}{wall:>9.1f}{rss / streamed[0]:>11.2f}")
    print("goal: ours < 150 MiB peak RSS whatever the output size")


if __name__ == "__main__":
    main()
