"""Files the orchestrator keeps in its state dir are never lost or silently replaced: a damaged
instance id or token file is an error naming the file and the fix, and the file is left as it
was; a missing instance id is made once, by exactly one of the processes that start at once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox import load_config_text
from sandbox.errors import ConfigError, ErrorCode, StateError
from sandbox.runtime.naming import Labels, instance_id
from tests.cli_helpers import ROOT, run_cli
from tests.service_helpers import sha

DAMAGED_IDS = [b"", b"\n", b"NOT-AN-ID\n", b"ab\n", b"\xff\xfe\x00garbage", b"a" * 17]


@pytest.mark.parametrize("content", DAMAGED_IDS)
def test_a_damaged_instance_id_is_an_error_and_never_replaced(tmp_path: Path, content: bytes) -> None:
    """An instance-id that is not an id (empty, bad characters, too long or short, binary) stops
    the start with an error naming the file and how to find the id the containers carry; the
    file keeps its bytes (a new id would make every container of the old one an orphan)."""
    (tmp_path / "instance-id").write_bytes(content)
    with pytest.raises(StateError) as info:
        instance_id(tmp_path, None)
    error = info.value
    assert error.code == ErrorCode.INTERNAL and not error.retryable
    assert str(tmp_path / "instance-id") in error.message and "damaged" in error.message
    assert f"label={Labels.MANAGED}=true" in error.fix and Labels.INSTANCE in error.fix
    assert "`instance:`" in error.fix
    assert (tmp_path / "instance-id").read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["instance-id"]


def test_an_unreadable_instance_id_is_an_error(tmp_path: Path) -> None:
    """An instance-id that cannot be read (here: a folder in its place) is an error, not a new id."""
    (tmp_path / "instance-id").mkdir()
    with pytest.raises(StateError) as info:
        instance_id(tmp_path, None)
    assert "cannot be read" in info.value.message and str(tmp_path / "instance-id") in info.value.message
    assert (tmp_path / "instance-id").is_dir()


def test_a_good_instance_id_is_kept_and_a_configured_one_wins(tmp_path: Path) -> None:
    """A valid file is read as it is; `instance:` in the config is used without reading the file."""
    (tmp_path / "instance-id").write_text("abc123\n")
    assert instance_id(tmp_path, None) == "abc123"
    (tmp_path / "instance-id").write_text("garbage!")
    assert instance_id(tmp_path, "mine") == "mine"


RACER = """
import sys, time
from pathlib import Path
from sandbox.runtime.naming import instance_id
go = Path(sys.argv[2])
while not go.exists():
    time.sleep(0.001)
print(instance_id(Path(sys.argv[1]), None))
"""


@pytest.mark.slow
def test_processes_starting_at_once_agree_on_one_instance_id(tmp_path: Path) -> None:
    """Twelve processes reading a state dir without an instance-id at the same moment all get the
    same id, the one in the file, and no temporary file is left behind."""
    state, go = tmp_path / "state", tmp_path / "go"
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(state), str(go)], stdout=subprocess.PIPE, text=True, cwd=ROOT
        )
        for _ in range(12)
    ]
    go.touch()
    ids = {racer.communicate(timeout=120)[0].strip() for racer in racers}
    assert all(racer.returncode == 0 for racer in racers)
    assert ids == {(state / "instance-id").read_text().strip()}
    assert [p.name for p in state.iterdir()] == ["instance-id"]


def test_the_cli_says_which_file_is_damaged_without_a_traceback(tmp_path: Path) -> None:
    """`explain` of a sandboxed session, which names the container the session would get, says
    the container cannot be made and why (the file, the fix), without a traceback; the file is
    unchanged."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "instance-id").write_text("Corrupted!\n")
    config = tmp_path / "c.yaml"
    config.write_text(f"state_dir: {state}\nagents: {{defaults: {{sandbox: {{mode: all}}}}}}\n")
    ran = run_cli("--config", str(config), "explain", "--session", "agent:main:x")
    assert ran.returncode == 0, ran.stderr
    assert f"container  cannot be made: the instance id file {state / 'instance-id'} is damaged" in ran.stdout
    assert "fix: restore the id the containers of this state dir carry" in ran.stdout
    assert "Traceback" not in ran.stdout + ran.stderr
    assert (state / "instance-id").read_text() == "Corrupted!\n"


def _token_config(tmp_path: Path) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(
        f"state_dir: {tmp_path / 'state'}\ntenants: [{{id: acme}}, {{id: beta}}]\n"
        "agents: {list: [{id: a, tenant: acme}, {id: b, tenant: beta}]}\n"
    )
    return path


@pytest.mark.parametrize(
    "content",
    [b'[{"tenant": "acme", "name": "ci", "sha256": "ab"', b"{}", b'["x"]', b'[{"tenant": 1, "sha256": "a"}]', b"\xff"],
)
def test_token_create_never_overwrites_a_damaged_token_file(tmp_path: Path, content: bytes) -> None:
    """`tenants token create` on a damaged token file (cut JSON, not a list, wrong entries, not
    text) is an error naming the file and the fix, and the file keeps every byte (today it was
    replaced by a list of the one new token: every other stored token lost)."""
    config = _token_config(tmp_path)
    tokens = tmp_path / "state" / "tenant-tokens.json"
    tokens.parent.mkdir()
    tokens.write_bytes(content)
    ran = run_cli("--config", str(config), "tenants", "token", "create", "acme", "--name", "new")
    assert ran.returncode == 1 and ran.stdout == ""
    assert f"the token file {tokens}" in ran.stderr and "fix: repair the JSON" in ran.stderr
    assert tokens.read_bytes() == content
    assert [p.name for p in tokens.parent.iterdir() if p.name.startswith(".tenant-tokens.json")] == []


def test_token_create_keeps_the_other_tokens(tmp_path: Path) -> None:
    """A new token is added beside the stored ones; the file is replaced whole (0600), nothing else is left."""
    config = _token_config(tmp_path)
    first = json.loads(run_cli("--config", str(config), "tenants", "token", "create", "acme", "--json").stdout)
    second = json.loads(run_cli("--config", str(config), "tenants", "token", "create", "beta", "--json").stdout)
    tokens = tmp_path / "state" / "tenant-tokens.json"
    stored = json.loads(tokens.read_text())
    assert [t["sha256"] for t in stored] == [sha(first["token"]), sha(second["token"])]
    assert oct(tokens.stat().st_mode)[-3:] == "600"
    assert [p.name for p in tokens.parent.iterdir() if p.name.startswith(".tenant-tokens.json")] == []


MAKER = """
import sys, time
from pathlib import Path
from sandbox import load_config
from sandbox.api.tenants import create_token
config = load_config(sys.argv[1])
go = Path(sys.argv[2])
while not go.exists():
    time.sleep(0.001)
print(create_token(config, "acme", sys.argv[3]))
"""


@pytest.mark.slow
def test_tokens_created_at_once_are_all_kept(tmp_path: Path) -> None:
    """Ten processes creating a token at the same moment each keep theirs: the read-modify-write
    of the file is serialised (without it, the last rename wins and the other tokens are lost)."""
    from sandbox import load_config
    from sandbox.api.tenants import authenticate

    config, go = _token_config(tmp_path), tmp_path / "go"
    makers = [
        subprocess.Popen(
            [sys.executable, "-c", MAKER, str(config), str(go), f"n{i}"], stdout=subprocess.PIPE, text=True, cwd=ROOT
        )
        for i in range(10)
    ]
    go.touch()
    made = [maker.communicate(timeout=120)[0].strip() for maker in makers]
    assert all(maker.returncode == 0 for maker in makers)
    stored = json.loads((tmp_path / "state" / "tenant-tokens.json").read_text())
    assert sorted(t["name"] for t in stored) == sorted(f"n{i}" for i in range(10))
    loaded = load_config(config)
    assert all(authenticate(loaded, token) is not None for token in made)


def test_serve_refuses_to_start_on_a_damaged_token_file(tmp_path: Path) -> None:
    """`serve` with a damaged token file stops before it listens, naming the file (not a service
    that silently refuses every stored token)."""
    config = _token_config(tmp_path)
    tokens = tmp_path / "state" / "tenant-tokens.json"
    tokens.parent.mkdir()
    tokens.write_text("not json")
    ran = run_cli("--config", str(config), "serve", "--port", "1")
    assert ran.returncode == 1 and f"the token file {tokens} is not valid JSON" in ran.stderr
    assert tokens.read_text() == "not json"


def test_a_running_service_refuses_the_tokens_of_a_damaged_file(tmp_path: Path) -> None:
    """While serving, a file damaged later refuses its tokens (fail closed: a token an operator
    was removing must not work) and the service keeps answering the config's tokens."""
    from sandbox.api.tenants import Tenants, create_token

    cfg = load_config_text(
        f"state_dir: {tmp_path / 'state'}\n"
        f"tenants: [{{id: acme, tokens: [{{name: ci, sha256: {sha('sbx_configured')}}}]}}]\n"
        "agents: {list: [{id: a, tenant: acme}]}\n"
    )
    tenants = Tenants(cfg)
    made = create_token(cfg, "acme", "laptop")
    assert tenants.authenticate(made) is not None
    (tmp_path / "state" / "tenant-tokens.json").write_text('[{"tenant": "acme", "sha256": ')
    assert tenants.authenticate(made) is None
    assert tenants.authenticate("sbx_configured") is not None


@pytest.mark.parametrize("below", [False, True])
def test_a_state_dir_that_is_a_file_is_a_config_error(tmp_path: Path, below: bool) -> None:
    """`state_dir` naming a file, or a path below a file, is a config error at `state_dir`."""
    (tmp_path / "afile").write_text("x")
    target = tmp_path / "afile" / "state" if below else tmp_path / "afile"
    with pytest.raises(ConfigError) as info:
        load_config_text(f"tools: {{}}\nstate_dir: {target}\n", source="cfg.yaml")
    (problem,) = info.value.problems
    assert problem.startswith("cfg.yaml:2:12: state_dir: ") and "not a folder" in problem
    assert str(tmp_path / "afile") in problem


def test_a_state_dir_still_to_be_made_is_fine(tmp_path: Path) -> None:
    """A state_dir that does not exist yet (below an existing folder) loads."""
    assert load_config_text(f"state_dir: {tmp_path / 'a' / 'b'}\n").state_dir == tmp_path / "a" / "b"
