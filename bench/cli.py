"""Benchmark: start-up of the CLI, each run a fresh process, against `python -c pass` in the same run.

Run: python bench/cli.py [runs]   (explain asks the engine whether the container exists when
one answers; without one it says so, which is as cheap)

Bytecode is cached in a temporary prefix (an installed package ships its .pyc; this checkout
may run with PYTHONDONTWRITEBYTECODE=1, which would charge every run for compiling the code).
The commands run in turns, so a busy machine slows each of them alike.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _stats import table

RUNS = int(sys.argv[1]) if len(sys.argv) > 1 else 15
WARMUP = 2

CONFIG = """\
state_dir: {tmp}/state
agents:
  defaults:
    workspace: {tmp}/workspace
    sandbox: {{mode: all, scope: session, workspace_access: rw}}
"""


def _sandbox_cmd() -> list[str]:
    script = Path(sys.executable).with_name("sandbox")  # the console script users run
    return [str(script)] if script.exists() else [sys.executable, "-m", "sandbox"]


def _wall_ms(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    return (time.perf_counter() - start) * 1000


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "workspace").mkdir()
        config = Path(tmp) / "config.yaml"
        config.write_text(CONFIG.format(tmp=tmp))
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        sandbox = _sandbox_cmd()
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "python -c 'import sandbox'": [sys.executable, "-c", "import sandbox"],
            "sandbox --help": [*sandbox, "--help"],
            "sandbox explain --session agent:main:x": [
                *sandbox,
                "--config",
                str(config),
                "explain",
                "--session",
                "agent:main:x",
            ],
        }
        samples: dict[str, list[float]] = {name: [] for name in commands}
        for turn in range(WARMUP + RUNS):
            for name, argv in commands.items():
                took = _wall_ms(argv, env)
                if turn >= WARMUP:
                    samples[name].append(took)
    base = samples["python -c pass"]
    goals = {"sandbox --help": "<= 150 ms", "sandbox explain --session agent:main:x": "<= 300 ms"}
    rows = [(name, ms, None if name == "python -c pass" else base, goals.get(name, "")) for name, ms in samples.items()]
    print(table(f"CLI start-up, wall time of a fresh process, {RUNS} runs each (ratio: to python -c pass)", rows))


if __name__ == "__main__":
    main()
