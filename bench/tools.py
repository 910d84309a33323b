"""Benchmark: the tools against raw docker SDK calls on the same container.

(`volume` rows: a `workspace_store: volume` workspace, whose files go through the resident agent.)

exec `true` through the tool vs `exec_run`; read/write of a 4 KB file through the tool vs
`get_archive`/`put_archive`, on a rw-bound workspace and on a `none` (scratch) workspace.
Run: python bench/tools.py   (needs the engine and `sandbox images build`)
"""

from __future__ import annotations

import io
import os
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import anyio
import docker
from _stats import table, timed, timed_async

from sandbox import Orchestrator, load_config_text

N = 200
CONTENT = "x" * 4095 + "\n"


def tar_of(name: str, data: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def measure(
    access: str, tmp: Path, client: docker.DockerClient, store: str = "host"
) -> list[tuple[str, list[float], list[float], str]]:
    ws = tmp / f"ws-{access}-{store}"
    ws.mkdir()
    os.chown(ws, 1000, 1000)
    config = load_config_text(
        f"state_dir: {tmp}/state-{access}-{store}\ninstance: bench{access}{store[0]}\n"
        f"agents: {{defaults: {{sandbox: {{mode: all, scope: agent, workspace_access: {access}, "
        f"workspace_store: {store}}}}}, "
        f"list: [{{id: a, workspace: '{ws}'}}]}}\n"
    )
    rows = []
    async with Orchestrator(config) as orch:
        sess = orch.session("agent:a:bench")
        await sess.call("write", {"path": "f.txt", "content": CONTENT})
        box = await sess.sandbox()
        container = client.containers.get(box.id)

        async def tool_exec() -> None:
            assert (await sess.call("exec", {"command": "true"})).ok

        async def tool_read() -> None:
            assert (await sess.call("read", {"path": "f.txt"})).ok

        async def tool_write() -> None:
            assert (await sess.call("write", {"path": "f.txt", "content": CONTENT})).ok

        archive = tar_of("f.txt", CONTENT.encode())
        if access != "none":
            rows.append(
                (
                    "exec `true`: tool vs exec_run",
                    await timed_async(tool_exec, N),
                    timed(lambda: container.exec_run(["true"]), N),
                    "<= 0.15x (resident agent)",
                )
            )
        rows.append(
            (
                f"read 4 KB ({access if store == 'host' else store} ws): tool vs get_archive",
                await timed_async(tool_read, N),
                timed(lambda: b"".join(container.get_archive("/workspace/f.txt")[0]), N),
                "<= 2 ms, >= 10x faster",
            )
        )
        rows.append(
            (
                f"write 4 KB ({access if store == 'host' else store} ws): tool vs put_archive",
                await timed_async(tool_write, N),
                timed(lambda: container.put_archive("/workspace", archive), N),
                "<= 2 ms, >= 10x faster",
            )
        )
        for info in await orch.manager.list():
            await orch.backend.remove(info.id)
    # a volume workspace outlives its sandbox (a session finds its files again): the bench's goes
    for volume in client.volumes.list(filters={"label": f"io.agent-sandbox.instance=bench{access}{store[0]}"}):
        volume.remove(force=True)
    return rows


async def main() -> None:
    client = docker.from_env()
    with tempfile.TemporaryDirectory() as tmp:
        rows = await measure("rw", Path(tmp), client)
        rows += await measure("none", Path(tmp), client)
        rows += await measure("none", Path(tmp), client, "volume")  # through the resident agent
    client.close()
    print(table(f"tools: p50/p90 over {N} calls each; baseline = raw docker SDK on the same container", rows))


if __name__ == "__main__":
    anyio.run(main)
