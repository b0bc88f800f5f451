"""Hostile signature and trust files under ``bundles_dir``: refused in one line, never a hang.

Real signed bundles installed by the real ``BundleReceiver``, then one file replaced by a
real FIFO or a real symlink to /dev/zero. These files are read at every start (the node's
``newer_installed_bundle``) and by the consolidator's ``Publisher.current``: a FIFO blocked
that read forever and /dev/zero filled memory until the process died, so the node never
started. The promise: the bundle is refused with one ERROR line and the node runs
``bundle_path``. A trust file that is well formed but cannot be this robot's own (a symlink,
writable by others, or a list no applied endorsement leads to from the configured key) is
refused with one ERROR line and the configured key alone is trusted. Cases that blocked
or filled memory run in a child process with a memory limit and a timeout, so the code
before the fix fails the test instead of the machine.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import nacl.signing
import pytest
from conftest import copy_bundle, run_bounded

from thinkmem_ros.consolidator.publish import PublishConfig, Publisher, PublishError, push_frame
from thinkmem_ros.link.key_endorsement import endorse, public_hex
from thinkmem_ros.link.protocol import decode_frame
from thinkmem_ros.link.security import (
    SIGNATURE_FILE,
    SignatureError,
    load_signing_key,
    sign_bundle,
    verify_bundle_signature,
    write_signing_keypair,
)
from thinkmem_ros.policy.bundle import MANIFEST, load_bundle
from thinkmem_ros.robot.bundle_receiver import (
    BundleReceiver,
    BundleReceiverConfig,
    point_current,
)
from thinkmem_ros.robot.node_config import NodeConfig
from thinkmem_ros.robot.shipping_link import newer_installed_bundle
from thinkmem_ros.robot.trust_store import (
    TRUST_FILE,
    TrustStore,
    TrustStoreConfig,
    TrustStoreError,
)

NODE_LOG = logging.getLogger("test_trust_files_hostile.node")  # stands in for the node
MEMORY_LIMIT = 2 << 30  # the child's address space: /dev/zero read whole ends in MemoryError
CHILD_TIMEOUT_S = 60.0

CHILD = """
import json, sys
from pathlib import Path
from thinkmem_ros.robot.node_config import NodeConfig
from thinkmem_ros.robot.shipping_link import newer_installed_bundle
bundles, bundle_path, pub = sys.argv[1:4]
said = []
class Log:
    def info(self, m): pass
    def warning(self, m): pass
    def error(self, m): said.append(m)
config = NodeConfig(bundle_path=bundle_path, bundles_dir=bundles)
path = newer_installed_bundle(config, Path(pub), Log())
print(json.dumps({"path": None if path is None else str(path), "errors": said}))
"""


@pytest.fixture
def robot(source_bundle, tmp_path):
    """bundles_dir with signed v2 installed by a push (current -> v2); bundle_path is v1."""
    pub, key = write_signing_keypair(tmp_path / "keys", "consolidator")
    folder = copy_bundle(source_bundle, tmp_path / "pub2", model_version=2)
    sign_bundle(folder, key)
    bundles = tmp_path / "bundles"
    rx = BundleReceiver(BundleReceiverConfig(bundles, pub, current_version=1))
    assert rx.handle_push(decode_frame(push_frame(folder)).body) is not None
    v1 = copy_bundle(source_bundle, tmp_path / "v1", model_version=1)
    config = NodeConfig(bundle_path=str(v1), bundles_dir=str(bundles))
    return SimpleNamespace(pub=pub, key=key, bundles=bundles, v1=v1, config=config,
                           installed=bundles / "v000002")


def make_hostile(path: Path, kind: str) -> None:
    """Replace ``path`` by a FIFO nobody writes, or by a symlink to /dev/zero."""
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path, 0o600)
    else:
        os.symlink("/dev/zero", path)


def release_fifo(path: Path) -> None:
    """Unblock a reader stuck on ``path`` (only the code before the fix ever is)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass



def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def start_in_child(robot) -> tuple[dict, str]:
    """``newer_installed_bundle`` as the node's start calls it, in a bounded child process:
    its outcome and what it logged."""
    argv = [sys.executable, "-c", CHILD, str(robot.bundles), str(robot.v1), str(robot.pub)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S,
                              preexec_fn=_limit_memory, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the node's start blocked for {CHILD_TIMEOUT_S:.0f} s")
    assert done.returncode == 0, done.stderr[-2000:]  # MemoryError: a traceback, exit 1
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


# ------------------------------------------------------------ special signature/manifest files
@pytest.mark.parametrize("name", [SIGNATURE_FILE, MANIFEST])
@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_a_special_installed_file_is_refused_and_the_node_starts(robot, name, kind):
    make_hostile(robot.installed / name, kind)
    try:
        outcome, _ = start_in_child(robot)
    finally:
        release_fifo(robot.installed / name)
    assert outcome["path"] is None, outcome  # bundle_path runs
    assert len(outcome["errors"]) == 1, outcome
    line = outcome["errors"][0]
    assert name in line and "running bundle_path v1" in line, line
    assert ("a FIFO" if kind == "fifo" else "a character device") in line, line


def test_verify_bundle_signature_refuses_a_fifo_signature(robot):
    """In this process: only a FIFO (the code before the fix read /dev/zero into memory)."""
    make_hostile(robot.installed / SIGNATURE_FILE, "fifo")
    try:
        finished, result = run_bounded(lambda: verify_bundle_signature(robot.installed,
                                                                       robot.pub))
    finally:
        release_fifo(robot.installed / SIGNATURE_FILE)
    assert finished, "reading the signature blocked"
    assert isinstance(result, SignatureError), result
    assert "cannot read" in str(result) and "\n" not in str(result)


def test_an_oversized_signature_is_refused_without_reading_it_whole(robot):
    signature = robot.installed / SIGNATURE_FILE
    signature.write_bytes(signature.read_bytes() + b"\0" * (1 << 20))
    with pytest.raises(SignatureError, match="larger than 64 bytes"):
        verify_bundle_signature(robot.installed, robot.pub)


def test_the_publisher_refuses_a_fifo_signature_in_its_history(source_bundle, tmp_path):
    """``Publisher.current`` verifies the published bundle the same way: a PublishError."""
    _, key = write_signing_keypair(tmp_path / "keys", "consolidator")
    initial = copy_bundle(source_bundle, tmp_path / "initial", model_version=1)
    publisher = Publisher(PublishConfig(tmp_path / "pub", key), initial)
    staged = load_bundle(copy_bundle(source_bundle, tmp_path / "s2", model_version=2))
    published = publisher.publish(staged).path
    make_hostile(published / SIGNATURE_FILE, "fifo")
    try:
        finished, result = run_bounded(publisher.current)
    finally:
        release_fifo(published / SIGNATURE_FILE)
    assert finished, "Publisher.current blocked on a FIFO bundle.sig"
    assert isinstance(result, PublishError) and "FIFO" in str(result), result


# ------------------------------------------------------------ special trust file
def test_a_fifo_trust_file_is_a_trust_store_error_not_a_hang(robot, caplog):
    make_hostile(robot.bundles / TRUST_FILE, "fifo")
    try:
        finished, result = run_bounded(
            lambda: TrustStore(TrustStoreConfig(robot.bundles, robot.pub)))
        assert finished, "reading the FIFO trust file blocked"
        assert isinstance(result, TrustStoreError), result
        assert TRUST_FILE in str(result) and "FIFO" in str(result), result
        with caplog.at_level(logging.INFO):
            finished, path = run_bounded(
                lambda: newer_installed_bundle(robot.config, robot.pub, NODE_LOG))
    finally:
        release_fifo(robot.bundles / TRUST_FILE)
    assert finished and path is None, path  # no installed bundle can be verified: bundle_path
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(lines) == 1 and TRUST_FILE in lines[0], lines


def test_an_oversized_trust_file_is_refused_at_its_cap(robot):
    (robot.bundles / TRUST_FILE).write_bytes(b" " * ((1 << 20) + 1))
    with pytest.raises(TrustStoreError, match="larger than"):
        TrustStore(TrustStoreConfig(robot.bundles, robot.pub))


# ------------------------------------------------------------ a trust file that is not ours
def errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def write_trust(bundles: Path, data: dict, mode: int = 0o644) -> Path:
    path = bundles / TRUST_FILE
    path.write_text(json.dumps(data))
    os.chmod(path, mode)
    return path


def rotated(robot) -> tuple[TrustStore, str]:
    """The trust file as a real rotation writes it: K1 endorses a new key (serial 1)."""
    new = nacl.signing.SigningKey.generate()
    store = TrustStore(TrustStoreConfig(robot.bundles, robot.pub))
    endorsement = endorse(load_signing_key(robot.key), new.verify_key, "add", 1)
    assert store.apply_chain([endorsement.to_dict()]).applied
    return store, public_hex(new.verify_key)


def load_refused(robot, caplog) -> TrustStore:
    """Load the store; it must trust the configured key alone and say why in one ERROR line."""
    caplog.clear()
    with caplog.at_level(logging.INFO):
        store = TrustStore(TrustStoreConfig(robot.bundles, robot.pub))
    assert store.trust.keys == (public_hex(robot.pub),) and store.serial == 0
    lines = errors(caplog)
    assert len(lines) == 1 and TRUST_FILE in lines[0] and "REFUSED" in lines[0], lines
    assert store.refused and store.refused in lines[0]
    assert warnings(caplog) == []  # no "rotated away by endorsement #0"
    return store


def test_a_rotated_trust_file_written_here_is_loaded(robot, caplog):
    _, new = rotated(robot)
    assert stat.S_IMODE(os.stat(robot.bundles / TRUST_FILE).st_mode) == 0o644
    with caplog.at_level(logging.INFO):
        again = TrustStore(TrustStoreConfig(robot.bundles, robot.pub))
    assert again.trust.keys == (public_hex(robot.pub), new) and again.serial == 1
    assert again.refused == "" and errors(caplog) == []


@pytest.mark.parametrize("mode, who", [(0o664, "group"), (0o646, "others"),
                                       (0o666, "group and others")],
                         ids=["group", "others", "both"])
def test_a_trust_file_others_may_write_is_refused(robot, caplog, mode, who):
    rotated(robot)
    os.chmod(robot.bundles / TRUST_FILE, mode)
    store = load_refused(robot, caplog)
    assert f"writable by {who} (mode {mode:o})" in store.refused, store.refused
    assert f"chmod 644 {robot.bundles / TRUST_FILE}" in store.refused


def test_a_symlinked_trust_file_is_refused_and_the_next_endorsement_replaces_it(robot,
                                                                                caplog):
    rotated(robot)
    elsewhere = robot.bundles.parent / "elsewhere.json"
    (robot.bundles / TRUST_FILE).rename(elsewhere)
    (robot.bundles / TRUST_FILE).symlink_to(elsewhere)
    store = load_refused(robot, caplog)
    assert "symlink" in store.refused and str(elsewhere) in store.refused
    # an endorsement applied now writes a file of its own over the link, not through it
    before = elsewhere.read_bytes()
    other = nacl.signing.SigningKey.generate()
    assert store.apply_chain([endorse(load_signing_key(robot.key), other.verify_key, "add",
                                      1).to_dict()]).applied
    assert not (robot.bundles / TRUST_FILE).is_symlink() and elsewhere.read_bytes() == before
    assert TrustStore(TrustStoreConfig(robot.bundles, robot.pub)).refused == ""


def test_a_trust_file_linked_to_dev_zero_is_refused_and_the_pushed_bundle_runs(robot):
    """Unread: the configured key still verifies the installed v2, so the node runs it."""
    (robot.bundles / TRUST_FILE).symlink_to("/dev/zero")
    outcome, logged = start_in_child(robot)
    assert outcome == {"path": str(robot.installed.resolve()), "errors": []}, outcome
    refusals = [line for line in logged.splitlines() if "REFUSED trust list" in line]
    assert len(refusals) == 1 and "/dev/zero" in refusals[0], logged


def unreachable_cases(configured: str, outsider: str) -> dict[str, tuple[dict, str]]:
    """name: (file contents, words of the refusal) for lists no endorsement leads to."""
    base = {"format": 1, "configured_key": configured}
    digest = "ab" * 32
    return {
        "serial 0 without the configured key": (
            {**base, "keys": [outsider], "serial": 0}, "serial 0"),
        "serial 0 with an extra key": (
            {**base, "keys": [configured, outsider], "serial": 0}, "serial 0"),
        "no configured_key recorded": (
            {"format": 1, "keys": [outsider], "serial": 0}, "does not record the key"),
        "started from another key": (
            {**base, "configured_key": outsider, "keys": [outsider], "serial": 1,
             "applied": [[1, digest]]}, "started from key"),
        "serial without endorsements": (
            {**base, "keys": [outsider], "serial": 3, "applied": []}, "do not rise"),
        "serials that do not rise": (
            {**base, "keys": [outsider], "serial": 2, "applied": [[2, digest], [2, digest]]},
            "do not rise"),
        "more keys than endorsements": (
            {**base, "keys": [configured, outsider, "cd" * 32], "serial": 1,
             "applied": [[1, digest]]}, "at most one new key"),
    }


CASES = list(unreachable_cases("a", "b"))


@pytest.mark.parametrize("case", CASES)
def test_a_trust_list_no_endorsement_leads_to_is_refused(robot, caplog, case):
    outsider = public_hex(nacl.signing.SigningKey.generate().verify_key)
    data, words = unreachable_cases(public_hex(robot.pub), outsider)[case]
    write_trust(robot.bundles, data)
    store = load_refused(robot, caplog)
    assert words in store.refused, store.refused


def test_a_trust_file_that_holds_a_key_twice_is_refused(robot):
    """With plain json the last "keys" won: a list naming an outsider first read as the
    rotated list and was trusted, while anyone reading the file saw the outsider."""
    rotated(robot)
    path = robot.bundles / TRUST_FILE
    outsider = public_hex(nacl.signing.SigningKey.generate().verify_key)
    path.write_text(path.read_text().replace('"keys":', f'"keys": ["{outsider}"], "keys":', 1))
    assert outsider in path.read_text()
    with pytest.raises(TrustStoreError, match="'keys' appears twice"):
        TrustStore(TrustStoreConfig(robot.bundles, robot.pub))


def test_a_refused_trust_file_is_said_once_however_often_it_is_read(robot, caplog):
    """The node reads the list at start (twice) and again per hot swap; each read logged
    the same REFUSED line, so a robot's log repeated it at every swap."""
    rotated(robot)
    os.chmod(robot.bundles / TRUST_FILE, 0o666)
    first = load_refused(robot, caplog)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        again = [TrustStore(TrustStoreConfig(robot.bundles, robot.pub)) for _ in range(3)]
    assert errors(caplog) == []
    assert all(store.refused == first.refused for store in again)
    assert all(store.trust.keys == (public_hex(robot.pub),) for store in again)


def test_an_outsider_listed_in_a_writable_trust_file_cannot_sign_what_the_node_runs(
        robot, source_bundle, caplog):
    """The attack: list your key in a world-writable trust file, install a bundle it signed."""
    outsider = nacl.signing.SigningKey.generate()
    evil = copy_bundle(source_bundle, robot.bundles / "v000003", model_version=3)
    sign_bundle(evil, outsider)
    point_current(robot.bundles, evil.name)
    write_trust(robot.bundles, {"format": 1, "keys": [public_hex(outsider.verify_key)],
                                "serial": 0, "configured_key": public_hex(robot.pub)},
                mode=0o666)
    with caplog.at_level(logging.INFO):
        path = newer_installed_bundle(robot.config, robot.pub, NODE_LOG)
    assert path == robot.installed.resolve(), path  # v2, signed by the configured key
    lines = errors(caplog)
    assert len(lines) == 2, lines  # the refused trust file, then the refused v3
    assert "writable by group and others" in lines[0] and "does not verify" in lines[1]
