"""Shared fixtures. Docker-marked tests use the real engine and the images built from images/.

Every container a test run makes carries this run's instance id (or the test-run label), and a
session fixture removes them all at the end, whatever happened.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# hypothesis keeps a folder of its own (even without an example database): not in the repo. It is
# the same folder from run to run, so the unicode table hypothesis builds for text strategies (about
# a second per worker) is made once per machine; nothing else is kept there, and nothing relies on it.
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", str(Path(tempfile.gettempdir()) / "agent-sandbox-hypothesis"))
from hypothesis import settings  # imported after its storage directory is chosen

ROOT = Path(__file__).resolve().parent.parent

# A bytecode cache for this run and every process it starts (workers, CLI subprocesses), kept
# inside .venv like scripts/test's: where PYTHONDONTWRITEBYTECODE is set, a plain `pytest`
# otherwise compiles the project and rewrites every test module's assertions again on each run,
# more than a third of the quick loop's CPU. Sources stay clean; outside a .venv of the checkout
# the cache goes to the temporary folder.
_PYCACHE = ROOT / ".venv" / "pycache" if (ROOT / ".venv").is_dir() else Path(tempfile.gettempdir()) / "sbx-pycache"
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
os.environ.setdefault("PYTHONPYCACHEPREFIX", str(_PYCACHE))
sys.dont_write_bytecode = False
sys.pycache_prefix = os.environ["PYTHONPYCACHEPREFIX"]

os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")

# Property tests: a quick profile for the loop while you work, a thorough one for CI
# (`.ci/run` sets HYPOTHESIS_PROFILE=thorough); each test's own settings add to the profile.
settings.register_profile("quick", max_examples=15, deadline=None, database=None)
settings.register_profile("thorough", max_examples=400, deadline=None, database=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "quick"))

# Tests never write into the repo or the user's home: configs without a state_dir (the examples,
# the built-in defaults, the demo) keep their state under this run's own XDG state home, and so
# does every CLI process a test starts (it inherits the environment).
_STATE_HOME = tempfile.mkdtemp(prefix="sbx-test-state-")
os.environ["XDG_STATE_HOME"] = _STATE_HOME
atexit.register(shutil.rmtree, _STATE_HOME, ignore_errors=True)
# the egress test lab (servers on a test network) is a fixture plugin shared by several modules
# and so is the private PostgreSQL server (tests/pg_server.py) the `postgres`-marked tests use
pytest_plugins = ["tests.egress_lab", "tests.k8s_egress_lab", "tests.pg_server"]
RUN_ID = f"t{secrets.token_hex(3)}"  # instance id of every orchestrator in this test run
TEST_LABEL = "io.agent-sandbox.test-run"


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects, so `-m "not docker"` leaves slow tests out
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Real-engine tests run on one worker, one after another (the 2-core machine's engine).
    Slow tests (no engine, but seconds each) join the docker tier for selection only: they
    still spread over every worker, and the quick loop (`-m "not docker"`) stays quick. The
    PostgreSQL tests (seconds each too) join it the same way, and share one worker, hence one
    private server."""
    for item in items:
        if item.get_closest_marker("docker") is not None:
            item.add_marker(pytest.mark.xdist_group("docker"))
        elif item.get_closest_marker("postgres") is not None:
            item.add_marker(pytest.mark.xdist_group("postgres"))
            item.add_marker(pytest.mark.docker)
        elif item.get_closest_marker("slow") is not None:
            item.add_marker(pytest.mark.docker)


@pytest.fixture(scope="session")
def run_id() -> str:
    """This test run's instance id."""
    return RUN_ID


@pytest.fixture(scope="session")
def docker_client() -> Iterator[object]:
    """A docker SDK client to the real engine; all this run's containers are removed at the end."""
    import docker

    client = docker.from_env()
    client.ping()
    yield client
    for container in client.containers.list(all=True, filters={"name": f"sbx-{RUN_ID}"}):
        remove_container(container)
    for container in client.containers.list(all=True, filters={"label": f"{TEST_LABEL}={RUN_ID}"}):
        remove_container(container)
    # egress proxies are named after their sandbox's hash, not the run: found by their instance
    from sandbox.runtime.docker import hostfirewall
    from sandbox.runtime.naming import Labels

    for container in client.containers.list(all=True, filters={"label": f"{Labels.KIND}=egress-proxy"}):
        if str(container.labels.get(Labels.INSTANCE, "")).startswith(RUN_ID):
            remove_container(container)
            hostfirewall.remove_tagged(container.name)  # its rule on the upstream bridge
    remove_run_networks(client)
    remove_run_volumes(client)
    client.close()


def remove_run_volumes(client: object) -> None:
    """Remove the workspace volumes this run's sandboxes made (a volume outlives its container by
    design: the test that made it is done with it)."""
    from sandbox.runtime.naming import Labels

    for volume in client.volumes.list(filters={"label": Labels.INSTANCE}):  # type: ignore[attr-defined]
        if not str((volume.attrs.get("Labels") or {}).get(Labels.INSTANCE, "")).startswith(RUN_ID):
            continue
        try:
            volume.remove(force=True)
        except Exception as exc:  # still in use by a container of another fixture: report, go on
            print(f"could not remove test volume {volume.name}: {exc}", file=sys.stderr)


def remove_container(container: Any) -> None:
    """Remove one of this run's containers; a failure (an engine slow under load, a removal
    already under way) is reported and the sweep goes on, so one never leaves the rest behind."""
    for attempt in range(2):
        try:
            container.remove(force=True, v=True)
            return
        except Exception as exc:
            if "No such container" in str(exc) or "already in progress" in str(exc):
                return
            if attempt:
                print(f"could not remove test container {container.name}: {exc}", file=sys.stderr)


def remove_run_networks(client: object) -> None:
    """Remove the networks this run's orchestrators made (browser networks) and their host firewall rules."""
    from sandbox.runtime.docker import hostfirewall
    from sandbox.runtime.naming import Labels

    for network in client.networks.list(filters={"label": Labels.INSTANCE}):  # type: ignore[attr-defined]
        labels = network.attrs.get("Labels") or {}
        if not str(labels.get(Labels.INSTANCE, "")).startswith(RUN_ID) and labels.get(TEST_LABEL) != RUN_ID:
            continue
        bridge = (network.attrs.get("Options") or {}).get("com.docker.network.bridge.name", "")
        try:
            network.remove()
        except Exception as exc:  # still in use by a container of another fixture: report, go on
            print(f"could not remove test network {network.name}: {exc}", file=sys.stderr)
            continue
        if bridge:
            hostfirewall.remove_rules(bridge)


@pytest.fixture(scope="session")
def images(docker_client: object) -> None:
    """Build (or confirm up to date) the exec, browser and egress images from images/."""
    from sandbox.runtime.docker.images import ImageTarget, build_all

    build_all(
        docker_client,
        [
            ImageTarget("sandbox", "sandbox-exec:latest"),
            ImageTarget("browser", "sandbox-browser:latest"),
            ImageTarget("egress", "sandbox-egress:latest"),
        ],
        lambda line: print(line, file=sys.stderr),
    )


@pytest.fixture(scope="session")
def service_image(images: None) -> str:
    """sandbox-service:latest built by scripts/service-image (what compose.yaml runs)."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    built = subprocess.run([str(root / "scripts" / "service-image")], capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stderr[-2000:]
    return "sandbox-service:latest"


_instances = iter(range(1, 1_000_000))


@pytest.fixture
def instance(run_id: str) -> str:
    """An instance id of this run, unique to the test (container names start `sbx-<run>-`)."""
    return f"{run_id}-{next(_instances)}"


@pytest.fixture
def make_config(tmp_path: Path, instance: str) -> Callable[..., object]:
    """Load a YAML config with a fresh state dir and the test's instance id."""
    from sandbox.config import load_config_text

    def make(text: str = "{}", *, state: Path | None = None) -> object:
        import yaml

        data = yaml.safe_load(text) or {}
        data.setdefault("state_dir", str(state or tmp_path / "state"))
        data.setdefault("instance", instance)
        return load_config_text(yaml.safe_dump(data), source="test.yaml", base_dir=tmp_path)

    return make


@pytest.fixture
def anyio_backend() -> str:
    """Tests run on asyncio."""
    return "asyncio"


@pytest.fixture
async def fake_cluster(docker_client: object, images: None, run_id: str) -> AsyncIterator[object]:
    """A fake Kubernetes API whose Pods are real containers of this run (tests/k8s_fake_cluster.py)."""
    from tests.k8s_fake_cluster import FakeCluster

    async with FakeCluster(docker_client=docker_client, run_label=(TEST_LABEL, run_id)) as fake:
        yield fake
