"""Hostile input to ``thinkmem_consolidator`` (and its receive-only sibling): one line, exit 2.

The project rule for every command: bad input prints one line and exits non-zero, never a
traceback, never exit 0 on input it could not use, never a hang, never silent data loss.
Each case here broke it once: another program's SQLite file gained the store's tables and
a round exited 0 on it; a FIFO given as a key or a store blocked forever; ``--check-s inf``
printed READY and died on an OverflowError; ``--curve off`` with an allow-list ran
unauthenticated; a Ctrl-C while the initial model loaded printed a traceback.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import copy_bundle

from thinkmem_ros.consolidator import service
from thinkmem_ros.consolidator.knowledge import KnowledgeStore, KnowledgeStoreError
from thinkmem_ros.consolidator.publish import (
    ARTEFACT_FILES,
    PublishConfig,
    Publisher,
    attach_artefacts,
)
from thinkmem_ros.consolidator.receive import ReceiveConfig
from thinkmem_ros.consolidator.store import APPLICATION_ID, ExperienceStore, StoreError
from thinkmem_ros.link.security import write_curve_keypair, write_signing_keypair
from thinkmem_ros.policy.bundle import load_bundle

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")


@pytest.fixture
def keys(tmp_path):
    """A signing key, the server's CURVE pair and an allow-list folder with one robot."""
    _, sign = write_signing_keypair(tmp_path / "keys", "c")
    _, secret = write_curve_keypair(tmp_path / "keys", "c")
    write_curve_keypair(tmp_path / "keys" / "allowed", "robot1")
    return {"sign": sign, "secret": secret, "allow": tmp_path / "keys" / "allowed"}


@pytest.fixture
def store(tmp_path):
    ExperienceStore(tmp_path / "c.db").close()
    return tmp_path / "c.db"


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


def foreign_db(path: Path) -> Path:
    """Another application's SQLite file: one table of its own."""
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER, name TEXT)")
        conn.execute("INSERT INTO customers VALUES (1, 'ada')")
    conn.close()
    return path


def run_main(capsys, *argv) -> tuple[int, str]:
    """Exit status and stderr of ``thinkmem_consolidator ARGV`` run in this process.

    The signal handlers a started service installs are put back, so pytest's stay.
    """
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = service.main([str(a) for a in argv])
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    return code, capsys.readouterr().err


def assert_one_line(code: int, err: str, *names: object) -> None:
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for name in names:
        assert str(name) in err, err


def run_process(tmp_path, *argv, module="thinkmem_ros.consolidator.service", timeout=30):
    """The command as a process: a hang fails the test after ``timeout`` instead of for good."""
    try:
        return subprocess.run([sys.executable, "-m", module, *[str(a) for a in argv]],
                              capture_output=True, text=True, env=ENV, cwd=tmp_path,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{module} {' '.join(map(str, argv))} blocked for {timeout} s")


# ------------------------------------------------------------------ the store file

def test_another_programs_database_is_refused_before_anything_is_written(tmp_path):
    path = foreign_db(tmp_path / "app.db")
    before = path.read_bytes()
    with pytest.raises(StoreError, match="not a thinkmem store") as refused:
        ExperienceStore(path)
    assert str(path) in str(refused.value) and "customers" in str(refused.value)
    for read_only in (False, True):
        with pytest.raises(KnowledgeStoreError, match="not a thinkmem store"):
            KnowledgeStore(path, read_only=read_only)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]


def test_a_file_another_application_id_claims_is_refused(tmp_path):
    path = tmp_path / "gpkg.db"
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA application_id = 1196444487")  # GeoPackage's
    conn.close()
    with pytest.raises(StoreError, match="application id 0x47504b47"):
        ExperienceStore(path)


def test_an_empty_file_becomes_a_store_that_says_what_it_is(tmp_path):
    path = tmp_path / "new.db"
    path.write_bytes(b"")
    ExperienceStore(path).close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    conn.close()


def test_a_store_written_before_the_header_id_still_opens(tmp_path, store):
    with sqlite3.connect(store) as conn:  # as every store written before the id existed
        conn.execute("PRAGMA application_id = 0")
        conn.execute("INSERT INTO experiences (robot_id, seq, episode_id, stamp, "
                     "bundle_version, payload) VALUES ('r1', 1, 'e1', 1.0, 1, x'00')")
    conn.close()
    with ExperienceStore(store, flush_rows=0) as opened:
        assert opened.count() == 1
    with KnowledgeStore(store, read_only=True) as knowledge:
        assert knowledge.load() == []
    with sqlite3.connect(store) as conn:
        assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    conn.close()


def test_once_on_another_programs_database_is_refused_and_leaves_it_alone(tmp_path, keys,
                                                                          capsys):
    path = foreign_db(tmp_path / "app.db")
    before = path.read_bytes()
    code, err = run_main(capsys, "--once", "--db", path, "--signing-key", keys["sign"],
                         "--publish-dir", tmp_path / "pub")
    assert_one_line(code, err, "thinkmem consolidator:", path, "not a thinkmem store")
    assert path.read_bytes() == before
    assert not list(tmp_path.glob("app.db-*"))


def test_once_on_an_empty_file_is_refused_and_leaves_it_empty(tmp_path, keys, capsys):
    path = tmp_path / "empty.db"
    path.write_bytes(b"")
    code, err = run_main(capsys, "--once", "--db", path, "--signing-key", keys["sign"],
                         "--publish-dir", tmp_path / "pub")
    assert_one_line(code, err, "thinkmem consolidator:", path, "holds no store")
    assert path.stat().st_size == 0


def test_serving_still_makes_a_new_store_of_an_empty_file(tmp_path, keys):
    path = tmp_path / "empty.db"
    path.write_bytes(b"")
    proc = subprocess.Popen(
        [sys.executable, "-m", "thinkmem_ros.consolidator.service", "--db", str(path),
         "--publish-dir", str(tmp_path / "pub"), "--signing-key", str(keys["sign"]),
         "--bind", "tcp://127.0.0.1:*", "--curve", "off"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=tmp_path)
    try:
        assert proc.stdout.readline().startswith("READY "), proc.stderr.read()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    with ExperienceStore(path) as opened:
        assert opened.count() == 0


def without_write_override(argv: list) -> list[str]:
    """``argv`` run so that file modes bind it: as root, without CAP_DAC_OVERRIDE (capsh)."""
    argv = [str(a) for a in argv]
    if os.geteuid() != 0:
        return argv
    if shutil.which("capsh") is None:
        pytest.skip("running as root without capsh: a 0444 store stays writable to root")
    return ["capsh", "--drop=cap_dac_override,cap_dac_read_search", "--", "-c",
            shlex.join(argv)]


@pytest.mark.parametrize("module, argv", [
    ("service", ["--bind", "tcp://127.0.0.1:*", "--curve", "off"]),
    ("service", ["--once"]),
    ("receive", ["--bind", "tcp://127.0.0.1:*", "--curve", "off"]),
], ids=["serve", "once", "receive"])
def test_a_store_it_cannot_write_is_refused_at_start(tmp_path, keys, store, module, argv):
    """On a 0444 store serving printed READY and then refused every batch ("attempt to
    write a readonly database") while robots re-sent forever."""
    store.chmod(0o444)
    if module == "service":
        argv += ["--signing-key", keys["sign"], "--publish-dir", tmp_path / "pub"]
    argv = [sys.executable, "-m", f"thinkmem_ros.consolidator.{module}", "--db", store, *argv]
    try:
        done = subprocess.run(without_write_override(argv), capture_output=True, text=True,
                              env=ENV, cwd=tmp_path, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{module} served a store it cannot write")
    logged = re.compile(r"\d{4}-\d\d-\d\d [\d:,]+ thinkmem_ros\.")  # INFO lines, receive
    err = "".join(line for line in done.stderr.splitlines(True) if not logged.match(line))
    assert_one_line(done.returncode, err, store, "cannot be written", "readonly database")
    assert "READY" not in done.stdout


def published(tmp_path, keys, source_bundle, damage: str) -> Path:
    """A publish folder whose ``current`` is a signed v2, then damaged as ``damage`` says."""
    publisher = Publisher(PublishConfig(tmp_path / "pub", keys["sign"]), source_bundle)
    staged = copy_bundle(source_bundle, tmp_path / "staged", model_version=2)
    if damage == "artefact":  # its files' contents do not matter until a robot reads them
        (tmp_path / "memctl").mkdir()
        for name in ARTEFACT_FILES["memctl"]:
            (tmp_path / "memctl" / name).write_bytes(b"probes of " + name.encode())
        attach_artefacts(staged, {"memctl": tmp_path / "memctl"})
    publisher.publish(load_bundle(staged))
    v2, current = tmp_path / "pub" / "history" / "v000002", tmp_path / "pub" / "current"
    if damage == "artefact":  # listed with its sha256 in the signed manifest, then changed
        (v2 / ARTEFACT_FILES["memctl"][0]).write_bytes(b"other probes")
    elif damage == "manifest":  # an edit after signing
        text = (v2 / "bundle.json").read_text()
        (v2 / "bundle.json").write_text(text.replace('"model_version": 2', '"model_version":2'))
    elif damage == "onnx":  # one byte of the model
        data = bytearray((v2 / "policy.onnx").read_bytes())
        data[len(data) // 2] ^= 0xFF
        (v2 / "policy.onnx").write_bytes(bytes(data))
    elif damage == "signature":
        (v2 / "bundle.sig").unlink()
    else:  # current points at nothing
        current.unlink()
        current.symlink_to(Path("history") / "v000099")
    return tmp_path / "pub"


@pytest.mark.parametrize("damage", ["manifest", "onnx", "signature", "dangling-current",
                                    "artefact"])
def test_a_published_bundle_that_does_not_verify_is_refused_at_start(tmp_path, keys, store,
                                                                     source_bundle, capsys,
                                                                     damage):
    """--once got as far as its round and failed through the catch-all (exit 1)."""
    pub = published(tmp_path, keys, source_bundle, damage)
    code, err = run_main(capsys, "--once", "--db", store, "--signing-key", keys["sign"],
                         "--publish-dir", pub)
    assert_one_line(code, err, "thinkmem consolidator:", pub / "current",
                    "published bundle does not verify")


def test_serving_refuses_a_published_bundle_that_does_not_verify(tmp_path, keys, store,
                                                                 source_bundle):
    """It printed READY, then every round failed with a traceback in the log."""
    pub = published(tmp_path, keys, source_bundle, "manifest")
    done = run_process(tmp_path, "--db", store, "--signing-key", keys["sign"],
                       "--publish-dir", pub, "--bind", "tcp://127.0.0.1:*", "--curve", "off")
    assert_one_line(done.returncode, done.stderr, "thinkmem consolidator:",
                    "published bundle does not verify", "signature does not verify")
    assert "READY" not in done.stdout


def test_a_round_with_no_version_left_to_publish_is_refused_at_start(tmp_path, keys, store,
                                                                    source_bundle, capsys):
    """On a v(2^63 - 1) bundle (``thinkmem train --model-version`` allows it) the round
    trained, published v2^63 and only then crashed on SQLite's INTEGER overflow."""
    initial = copy_bundle(source_bundle, tmp_path / "initial", model_version=2**63 - 1)
    code, err = run_main(capsys, "--once", "--db", store, "--signing-key", keys["sign"],
                         "--publish-dir", tmp_path / "pub", "--initial-bundle", initial)
    assert_one_line(code, err, "thinkmem consolidator:", "v9223372036854775808",
                    "past the highest a bundle may carry")
    assert not list((tmp_path / "pub").glob("history/v*"))


@pytest.mark.parametrize("edit, says", [
    ("signal_names", "the bundle needs K="),
    ("labels", "labels must lie in [0, 1]"),
], ids=["other-signals", "labels-past-1"])
def test_a_rehearsal_npz_the_round_cannot_use_is_refused_at_start(tmp_path, keys, store,
                                                                  capsys, edit, says):
    """Unknown signal names failed through the catch-all after discovery ran; labels of 2.0
    were trained on."""
    import numpy as np

    from thinkmem_ros.consolidator.rehearsal import save_rehearsal
    from thinkmem_ros.core.data import SituationSet
    from thinkmem_ros.core.paths import default_bundle

    shipped = load_bundle(default_bundle()).manifest  # what the round rehearses it in
    path = tmp_path / "d.npz"
    save_rehearsal(SituationSet(signals=np.zeros((5, shipped.window, len(shipped.signals))),
                                labels=np.zeros((5, len(shipped.labels))),
                                signal_names=tuple(shipped.signals),
                                label_names=tuple(shipped.labels)), path)
    with np.load(path) as saved:
        contents = dict(saved)
    contents[edit] = (np.array([f"s{i}" for i in range(len(contents[edit]))])
                      if edit == "signal_names" else contents[edit] + 2)
    np.savez(path, **contents)
    code, err = run_main(capsys, "--once", "--db", store, "--signing-key", keys["sign"],
                         "--publish-dir", tmp_path / "pub", "--rehearsal-npz", path)
    assert_one_line(code, err, "thinkmem consolidator:", path, says)


# ------------------------------------------------------------------ FIFOs, at start

@pytest.mark.parametrize("argv, what", [
    (["--once", "--signing-key", "FIFO"], "signing key"),
    (["--once", "--endorsements", "FIFO"], "key chain"),
    (["--once", "--rehearsal-npz", "FIFO"], "rehearsal set"),
    (["--once", "--db", "FIFO"], "cannot open store"),
    (["--db", "FIFO", "--bind", "tcp://127.0.0.1:*", "--curve", "off"], "cannot open store"),
    (["--server-key", "FIFO", "--allow", "ALLOW", "--bind", "tcp://127.0.0.1:*"],
     "CURVE key pair"),
    (["--server-key", "SECRET", "--allow", "FIFO", "--bind", "tcp://127.0.0.1:*"],
     "allow-list"),
], ids=["signing-key", "endorsements", "rehearsal-npz", "db-once", "db-serving", "server-key",
        "allow"])
def test_a_fifo_for_a_file_is_refused_at_start(tmp_path, keys, store, fifo, argv, what):
    """It blocked forever in ``open`` waiting for a writer, with no output."""
    names = {"FIFO": fifo, "ALLOW": keys["allow"], "SECRET": keys["secret"]}
    argv = [names.get(a, a) for a in argv]
    base = ["--db", store, "--signing-key", keys["sign"], "--publish-dir", tmp_path / "pub"]
    done = run_process(tmp_path, *base, *argv)  # later options win
    assert_one_line(done.returncode, done.stderr, "thinkmem consolidator:", fifo, what,
                    "a FIFO")
    assert "READY" not in done.stdout


def test_a_knowledge_store_that_is_a_fifo_is_refused_without_blocking(tmp_path, fifo):
    code = ("import sys\nfrom thinkmem_ros.consolidator.knowledge import KnowledgeStore\n"
            "try:\n    KnowledgeStore(sys.argv[1], read_only=True)\n"
            "except Exception as exc:\n    sys.exit(str(exc))\n")
    try:
        done = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True,
                              text=True, env=ENV, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("KnowledgeStore blocked on a FIFO")
    assert done.returncode == 1 and "is a FIFO, not a file" in done.stderr


# ------------------------------------------------------------------ options, named

@pytest.mark.parametrize("argv, says", [
    (["--check-s", "inf"], "--check-s must be > 0 and <= 3600"),
    (["--check-s", "1e12"], "--check-s must be > 0 and <= 3600"),
    (["--canary-max-wait-s", "inf", "--canary-fraction", "0.5"],
     "--canary-max-wait-s must be a finite number"),
    (["--canary-max-wait-s", "1e308", "--canary-fraction", "0.5"],
     "--canary-max-wait-s must be a finite number of seconds, at most 2.592e+06"),
    (["--rehearsal-rows", "-1"], "--rehearsal-rows must be >= 1"),
    (["--threads", "100000"], "--threads must be in [0, 256]"),
    (["--seed", "-1"], "--seed must be in [0, 4294967295]"),
    (["--engine", "ray", "--train-workers", "100000"], "--train-workers must be in [1, 256]"),
    (["--canary-robots", ",,,"], "--canary-robots ',,,' names no robot id"),
    (["--canary-robots", "r1,no robot"], "'no robot': not a valid robot id"),
    (["--curve", "off", "--server-key", "SECRET", "--allow", "ALLOW"],
     "--curve off contradicts --server-key and --allow"),
    (["--curve", "off", "--allow", "ALLOW"], "--curve off contradicts --allow"),
    (["--allow", "ALLOW"], "--allow needs --server-key"),
    (["--bind", "tcp://127.0.0.1:*"], "--bind: --once runs one round on the store and exits"),
    (["--server-key", "SECRET", "--allow", "ALLOW"],
     "--server-key, --allow: --once runs one round on the store and exits"),
    (["--discovery-events", "10485"], "--discovery-events must be 0 (every episode) or at "
     "least 10486 (what one history of 1024 events can cost the scan)"),
    (["--discovery-events", "-1"], "--discovery-events must be >= 0"),
], ids=["check-s-inf", "check-s-huge", "canary-wait-inf", "canary-wait-huge", "rehearsal-rows",
        "threads", "seed", "train-workers", "canary-robots-empty", "canary-robots-bad-id",
        "curve-off-keys", "curve-off-allow", "allow-alone", "once-bind", "once-keys",
        "horizon-short", "horizon-negative"])
def test_an_option_that_cannot_work_is_refused_by_its_name(tmp_path, keys, store, capsys,
                                                           argv, says):
    """Each used to pass: --once then ran its round and exited 0, serving ran (READY) with
    an OverflowError later, or unauthenticated; or the line named a config field."""
    argv = [{"SECRET": keys["secret"], "ALLOW": keys["allow"]}.get(a, a) for a in argv]
    code, err = run_main(capsys, "--once", "--db", store, "--signing-key", keys["sign"],
                         "--publish-dir", tmp_path / "pub", *argv)
    assert_one_line(code, err, "thinkmem consolidator:", says)


@pytest.mark.parametrize("argv, says", [
    (["--curve", "off", "--server-key", "SECRET", "--allow", "ALLOW"],
     "--curve off contradicts --server-key and --allow"),
    (["--curve", "off", "--flush-rows", "-1"], "--flush-rows must be >= 0"),
], ids=["curve-off-keys", "flush-rows"])
def test_receive_refuses_as_the_consolidator_does(tmp_path, keys, argv, says):
    """The receive-only process shares these options; with CURVE off it served."""
    argv = [{"SECRET": keys["secret"], "ALLOW": keys["allow"]}.get(a, a) for a in argv]
    done = run_process(tmp_path, "--db", tmp_path / "r.db", "--bind", "tcp://127.0.0.1:*",
                       *argv, module="thinkmem_ros.consolidator.receive")
    assert_one_line(done.returncode, done.stderr, "consolidator.receive:", says)
    assert "READY" not in done.stdout


def test_receive_config_refuses_an_allow_list_with_curve_off(tmp_path, keys):
    with pytest.raises(ValueError, match="ReceiveConfig.curve off contradicts"):
        ReceiveConfig(db_path=tmp_path / "r.db", bind="tcp://127.0.0.1:*", curve="off",
                      server_secret_file=keys["secret"], allowed_clients=keys["allow"])


# ------------------------------------------------------------------ Ctrl-C at start

INTERRUPT_AT = """
import os, signal, sys, time
from thinkmem_ros import entry
from thinkmem_ros.consolidator import service

owner = service if sys.argv[1] == "check_inputs" else service.ConsolidatorService
original = getattr(owner, sys.argv[1])

def interrupted(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C, at this very step
    time.sleep(1)
    return original(*args, **kwargs)

setattr(owner, sys.argv[1], interrupted)
sys.argv = ["thinkmem_consolidator", *sys.argv[2:]]
sys.exit(entry.thinkmem_consolidator())
"""


@pytest.mark.parametrize("step, serving", [
    ("check_inputs", False),  # loading the initial model (~1-2 s with numba)
    ("_round", False),  # --once's round: it stops at its next step boundary
    ("start", True),  # binding and opening the store, before READY
], ids=["loading-inputs", "once-round", "binding"])
def test_a_ctrl_c_at_start_is_a_clean_stop(tmp_path, keys, store, step, serving):
    """Exit 0 and no traceback, as a Ctrl-C after READY.

    The signal is injected at the step (the process sends it to itself there): a real
    Ctrl-C timed to land in a 1-2 s window is unreliable on a loaded machine.
    """
    argv = ["--db", store, "--signing-key", keys["sign"], "--publish-dir", tmp_path / "pub"]
    argv += ["--bind", "tcp://127.0.0.1:*", "--curve", "off"] if serving else ["--once"]
    done = subprocess.run([sys.executable, "-c", INTERRUPT_AT, step, *map(str, argv)],
                          capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "READY" not in done.stdout, done.stderr
    assert not (tmp_path / "pub" / "history").exists() or not any(
        (tmp_path / "pub" / "history").iterdir())


INTERRUPT_RECEIVE = """
import os, signal, sys, time
from thinkmem_ros.consolidator import receive

original = receive.ReceiveProcess._line_bundles

def interrupted(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C while the bundles load
    time.sleep(1)
    return original(*args, **kwargs)

receive.ReceiveProcess._line_bundles = interrupted
sys.exit(receive.main(sys.argv[1:]))
"""


def test_a_ctrl_c_while_the_receiver_loads_its_bundles_is_a_clean_stop(tmp_path):
    """It printed a KeyboardInterrupt traceback (the stop handlers come after the load)."""
    argv = ["--db", tmp_path / "r.db", "--bind", "tcp://127.0.0.1:*", "--curve", "off"]
    done = subprocess.run([sys.executable, "-c", INTERRUPT_RECEIVE, *map(str, argv)],
                          capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "READY" not in done.stdout, done.stderr


INTERRUPT_AT_EXIT = """
import atexit, os, signal, sys, time
from thinkmem_ros import entry

def interrupted():  # runs as the interpreter tears down, after main returned
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.5)

atexit.register(interrupted)
sys.argv = ["thinkmem_consolidator", *sys.argv[1:]]
sys.exit(entry.thinkmem_consolidator())
"""


def test_a_ctrl_c_while_the_process_exits_keeps_its_clean_exit(tmp_path, keys, store):
    """A Ctrl-C in the ~0.3 s the interpreter takes to exit after a round ended in 130.

    Injected for the same reason as above, in an atexit callback: the last Python code
    that runs before the interpreter resets its handlers and tears down.
    """
    argv = ["--once", "--db", store, "--signing-key", keys["sign"], "--publish-dir",
            tmp_path / "pub"]
    done = subprocess.run([sys.executable, "-c", INTERRUPT_AT_EXIT, *map(str, argv)],
                          capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "KeyboardInterrupt" not in done.stderr and "Traceback" not in done.stderr


INTERRUPT_IMPORT = """
import os, runpy, signal, sys, importlib.abc

class CtrlCAtImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "thinkmem_ros.consolidator.canary":  # one of the service's imports
            os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C, while it loads
        return None

sys.meta_path.insert(0, CtrlCAtImport())
sys.argv = ["service", "--help"]
runpy.run_module("thinkmem_ros.consolidator.service", run_name="__main__", alter_sys=True)
"""


def test_a_ctrl_c_while_python_m_service_loads_is_a_clean_stop(tmp_path):
    """``python -m thinkmem_ros.consolidator.service`` imports its modules before its main
    exists: a Ctrl-C then printed a KeyboardInterrupt traceback (the console script is
    guarded in ``entry``). The signal is sent from inside the import, as a timed Ctrl-C
    cannot be placed reliably."""
    done = subprocess.run([sys.executable, "-c", INTERRUPT_IMPORT], capture_output=True,
                          text=True, env=ENV, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "usage" not in done.stdout, done.stderr
