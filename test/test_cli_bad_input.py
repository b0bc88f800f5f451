"""Hostile input to every ``thinkmem`` verb: one line on stderr, a non-zero exit, no traceback.

Each case feeds one bad value (a file that is not what it claims, an unwritable output, a
NaN, an unknown name) through ``thinkmem_ros.cli.main`` in-process and asserts the project
rule: exit status != 0, stderr a single line naming the problem, and no work done first
(each case returns in well under two seconds; none trains, plays into ROS or benchmarks).
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest
from cli_checks import assert_one_line, run

from thinkmem_ros import cli
from thinkmem_ros.consolidator import service

REAL = Path(__file__).resolve().parent / "data" / "real"
SMALL_TRAIN = ["--duration", "130", "--streams", "2", "--epochs", "1", "--test-duration", "0",
               "--no-progress"]  # if a check were missing, training stays seconds, not minutes






@pytest.fixture
def files(tmp_path):
    """Bad inputs: a text file posing as SQLite, garbage bytes, a malformed rosbag2 folder."""
    (tmp_path / "not.db").write_text("not a database at all\n" * 50)
    (tmp_path / "garbage.bin").write_bytes(bytes(range(256)) * 16)
    bag = tmp_path / "badmeta"
    bag.mkdir()
    (bag / "metadata.yaml").write_text("rosbag2_bagfile_information:\n"
                                       "  version: [unclosed\n  : : :\n")
    (tmp_path / "a_folder").mkdir()
    return tmp_path


@pytest.fixture
def signing_key(tmp_path, capsys):
    assert cli.main(["keys", "--out", str(tmp_path / "k"), "--name", "c"]) == 0
    capsys.readouterr()
    return tmp_path / "k" / "c.sign.key"


# ------------------------------------------------------------------ knowledge, bag

@pytest.mark.parametrize("db, reason", [("not.db", "file is not a database"),
                                        ("a_folder", "is a folder, not a database")])
def test_knowledge_list_of_a_non_database(files, capsys, db, reason):
    code, err = run(capsys, "knowledge", "list", "--db", files / db)
    assert_one_line(code, err, "thinkmem knowledge:", reason)


def test_knowledge_list_looks_without_writing(tmp_path, capsys):
    """Listing opens the file read-only: an empty file stays empty (it used to become a
    database with knowledge tables; it is refused as no store now), and an experience
    store no round has written knowledge to lists no units."""
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    store = tmp_path / "store.db"
    with sqlite3.connect(store) as conn:
        conn.execute("CREATE TABLE experiences (id INTEGER)")
    before = store.read_bytes()
    assert cli.main(["knowledge", "list", "--db", str(store)]) == 0
    assert "no knowledge units" in capsys.readouterr().out
    assert cli.main(["knowledge", "list", "--db", str(empty)]) == 2
    assert "no consolidator store" in capsys.readouterr().err
    assert empty.stat().st_size == 0 and store.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.db", "store.db"]


@pytest.mark.parametrize("verb", ["info", "play"])
def test_bag_with_malformed_metadata_is_one_line(files, capsys, verb):
    code, err = run(capsys, "bag", verb, files / "badmeta")
    assert_one_line(code, err, f"thinkmem bag {verb}: error: cannot open bag", "metadata.yaml")


# ------------------------------------------------------------------ train

@pytest.mark.parametrize("argv, name", [
    (["--epochs", "-1"], "--epochs must be >= 1"),
    (["--model-version", "-1"], "--model-version must be in [0, "),
    (["--threads", "0"], "--threads must be in [1, "),
    (["--lr", "nan"], "--lr must be a finite number > 0"),
    (["--signal-drop", "1"], "--signal-drop"),
    (["--test-duration", "-5"], "--test-duration must be a finite number >= 0"),
    (["--test-duration", "3"], "fewer frames than --window"),
    (["--preset", "bogus"], "--preset 'bogus': unknown"),
    (["--scenario", "bogus"], "unknown scenario 'bogus'"),
    (["--duration", "nan"], "duration must be a finite number > 0"),
    # each within OPTION_MAX, the product not: a hang spawning 10^9 generators, a segfault
    # or MemoryError after minutes, a MemoryError through the catch-all
    (["--streams", "1000000000"], "at most 8 GiB is built in memory"),
    (["--streams", "100000"], "is 43,433,333 situations"),
    (["--max-events", "1000000000"], "--max-events must be at most 1024"),
], ids=["epochs", "model-version", "threads", "lr-nan", "signal-drop", "test-duration-negative",
        "test-duration-short", "preset", "scenario", "duration-nan", "streams-billion",
        "streams-many", "max-events"])
def test_train_refuses_bad_options_before_building_data(tmp_path, capsys, argv, name):
    code, err = run(capsys, "train", *SMALL_TRAIN, *argv, "--out", tmp_path / "b")
    assert_one_line(code, err, name)
    assert "training on" not in err and not (tmp_path / "b").exists()


def test_train_refuses_an_unwritable_out(capsys):
    code, err = run(capsys, "train", *SMALL_TRAIN, "--out", "/proc/x")
    assert_one_line(code, err, "--out /proc/x: cannot write")


def test_train_refuses_to_replace_a_file_or_a_folder_that_is_no_bundle(files, capsys):
    code, err = run(capsys, "train", *SMALL_TRAIN, "--out", files / "garbage.bin")
    assert_one_line(code, err, "garbage.bin: not a folder")
    assert (files / "garbage.bin").is_file()
    (files / "a_folder" / "notes.txt").write_text("mine")
    code, err = run(capsys, "train", *SMALL_TRAIN, "--out", files / "a_folder")
    assert_one_line(code, err, "not a bundle")
    assert (files / "a_folder" / "notes.txt").read_text() == "mine"


def test_train_params_with_malformed_yaml_is_one_line(files, capsys):
    code, err = run(capsys, "train", "--bag", files / "badmeta", "--labels", "feedback",
                    "--params", files / "badmeta" / "metadata.yaml", "--out", files / "b")
    assert_one_line(code, err, "cannot read parameters")


# ------------------------------------------------------------------ calibrate

def test_calibrate_refuses_an_unwritable_json_first(capsys):
    code, err = run(capsys, "calibrate", REAL / "husky_outdoor.bag",
                    "--params", REAL / "husky_params.yaml", "--json", "/proc/x/r.json")
    assert_one_line(code, err, "--json /proc/x/r.json: cannot write")


def test_calibrate_params_with_malformed_yaml_is_one_line(files, capsys):
    code, err = run(capsys, "calibrate", REAL / "husky_outdoor.bag",
                    "--params", files / "badmeta" / "metadata.yaml")
    assert_one_line(code, err, "thinkmem calibrate:", "cannot read parameters")


# ------------------------------------------------------------------ keys, demo, bench

@pytest.mark.parametrize("out", ["garbage.bin", "/proc/x"])
def test_keys_out_that_cannot_be_a_folder(files, capsys, out):
    code, err = run(capsys, "keys", "--out", files / out)
    assert_one_line(code, err, "thinkmem keys:", out)


def test_keys_refused_overwrite_goes_to_stderr(signing_key, capsys):
    code, err = run(capsys, "keys", "--out", signing_key.parent, "--name", "c")
    assert code == 2
    assert_one_line(code, err, "refusing to overwrite", "--force")


def test_demo_out_that_is_a_file(files, capsys):
    code, err = run(capsys, "demo", "--offline", "--no-consolidation", "--quiet",
                    "--duration", "10", "--out", files / "garbage.bin")
    assert_one_line(code, err, "thinkmem demo: error:", "garbage.bin")


@pytest.mark.parametrize("option, path", [("--json", "/proc/x/r.json"), ("--plot", "FOLDER")])
def test_bench_refuses_an_unwritable_output_before_running(files, capsys, monkeypatch,
                                                          option, path):
    def never(name):
        raise AssertionError(f"benchmark {name} started before its output was checked")

    monkeypatch.setattr("thinkmem_ros.commands.bench.load", never)
    path = files / "a_folder" if path == "FOLDER" else path
    code, err = run(capsys, "bench", "latency", option, path)
    assert_one_line(code, err, f"{option} {path}")


# ------------------------------------------------------------------ consolidator

@pytest.mark.parametrize("argv, name", [
    (["--db", "not.db"], "file is not a database"),
    (["--db", "a_folder"], "cannot open store"),
    (["--rehearsal-npz", "garbage.bin"], "not a rehearsal npz"),
    (["--check-s", "nan"], "--check-s must be > 0"),
    (["--period-s", "nan"], "--period-s must be > 0"),
    (["--db", "typo.db"], "no such store"),
], ids=["db-not-sqlite", "db-folder", "npz-garbage", "check-s-nan", "period-s-nan", "db-typo"])
@pytest.mark.parametrize("entry", [cli.main, service.main], ids=["thinkmem", "service"])
def test_consolidator_once_bad_input(files, signing_key, capsys, argv, name, entry):
    argv = [str(files / a) if a in ("not.db", "a_folder", "garbage.bin", "typo.db") else a
            for a in argv]
    prefix = ["consolidator"] if entry is cli.main else []
    code, err = run(capsys, *prefix, "--once", "--signing-key", signing_key,
                    "--db", files / "c.db", *argv, entry=entry)
    assert_one_line(code, err, "thinkmem consolidator:", name)


@pytest.mark.parametrize(("entry", "argv", "names"), [
    (cli.main, ["--bogus"], ["thinkmem: error", "thinkmem --help"]),
    (cli.main, ["bench", "nosuch"], ["invalid choice", "thinkmem bench --help"]),
    (cli.main, ["train", "--epochs", "x"], ["--epochs", "invalid int value"]),
    (service.main, ["--period-s"], ["thinkmem_consolidator: error", "--period-s"]),
], ids=["no-verb", "unknown-bench", "bad-int", "consolidator-missing-value"])
def test_usage_errors_are_one_line_pointing_at_help(capsys, entry, argv, names):
    code, err = run(capsys, *argv, entry=entry)
    assert code == 2
    assert_one_line(code, err, *names)
    assert "usage:" not in err


# ------------------------------------------------------------------ damaged knowledge, last net

def _knowledge_db(path: Path, **column) -> Path:
    """A store with one knowledge unit, one column overwritten with a damaged value."""
    from thinkmem_ros.consolidator.knowledge import KnowledgeStore, KnowledgeUnit

    with KnowledgeStore(path) as store:
        store.save([KnowledgeUnit(pattern=("a", "b", "c"), relation="sequence3",
                                  constraints={}, thinking="consider:c", confidence=0.9,
                                  status="promoted")])
    with sqlite3.connect(path) as conn:
        for name, value in column.items():
            conn.execute(f"UPDATE knowledge_units SET {name} = ?", (value,))
    return path


@pytest.mark.parametrize("column", [
    {"pattern": "not json"}, {"confidence": "high"}, {"status": "weird"}, {"history": "[5]"},
    None, {"pattern": '"EAB"'}, {"experiences": '{"a": 1}'}, {"constraints": "[1]"},
    {"rounds": "abc"}, {"pattern": '["A", 2]'}],
    ids=["pattern", "confidence", "status", "history", "no-table", "pattern-string",
         "experiences-object", "constraints-list", "rounds-text", "pattern-number"])
def test_knowledge_list_of_damaged_units_is_one_line(tmp_path, capsys, column):
    db = _knowledge_db(tmp_path / "k.db", **(column or {}))
    if column is None:
        with sqlite3.connect(db) as conn:
            conn.execute("DROP TABLE knowledge_units")
    for extra in ([], ["--json"]):
        code, err = run(capsys, "knowledge", "list", "--db", db, *extra)
        assert_one_line(code, err, "thinkmem knowledge:", "k.db")


def test_an_error_no_verb_anticipated_is_still_one_line(tmp_path, capsys, monkeypatch):
    """The command's last net turns an error no verb handles into one line; the variable
    shows the traceback. The error is injected (a mock): every hostile input found so far
    is now anticipated by its verb, so no real input is known to reach the net."""
    from thinkmem_ros.commands import calibrate

    def boom(args):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(calibrate, "main", boom)
    argv = ["calibrate", str(REAL / "husky_outdoor.bag"), "--params",
            str(REAL / "husky_params.yaml")]
    code, err = run(capsys, *argv)
    assert_one_line(code, err, "thinkmem calibrate: error: RecursionError")
    monkeypatch.setenv(cli.TRACEBACK_ENV, "1")
    with pytest.raises(RecursionError):
        cli.main(argv)


def test_yaml_nested_too_deeply_is_a_one_line_refusal(tmp_path, capsys):
    """5,000 nested lists: a RecursionError inside PyYAML, now named as what it is."""
    deep = tmp_path / "deep.yaml"
    deep.write_text("[" * 5000 + "]" * 5000)
    code, err = run(capsys, "calibrate", REAL / "husky_outdoor.bag", "--params", deep)
    assert_one_line(code, err, "thinkmem calibrate:", "nested too deeply")
    assert "Recursion" not in err and "recursion" not in err


@pytest.mark.parametrize("entry", [cli.main, service.main], ids=["thinkmem", "service"])
def test_consolidator_refuses_a_damaged_knowledge_store_before_a_round(tmp_path, signing_key,
                                                                      capsys, entry):
    db = _knowledge_db(tmp_path / "c.db", pattern="not json")
    prefix = ["consolidator"] if entry is cli.main else []
    code, err = run(capsys, *prefix, "--once", "--signing-key", signing_key, "--db", db,
                    entry=entry)
    assert_one_line(code, err, "thinkmem consolidator:", "malformed knowledge unit")


@pytest.mark.parametrize("argv", [["--duration", "1e308"], ["--duration", "5", "--rate", "1e9"],
                                  ["--duration", "0.01"]], ids=["inf", "rate", "no-frame"])
def test_bag_write_refuses_a_stream_that_cannot_be(tmp_path, capsys, argv):
    """A typo'd duration or rate: one line at once, not a memory error minutes later."""
    code, err = run(capsys, "bag", "write", "--scenario", "mixed", *argv,
                    "--out", tmp_path / "b")
    assert_one_line(code, err, "thinkmem bag write: error:", "frames")
    assert not (tmp_path / "b").exists()


@pytest.fixture
def unloadable_bundle(source_bundle, tmp_path) -> Path:
    """A bundle whose manifest hashes its model correctly, but the model is not ONNX."""
    from thinkmem_ros.policy.bundle import read_manifest, write_bundle

    return write_bundle(tmp_path / "junk", b"not an onnx graph",
                        read_manifest(source_bundle)).path


def test_bench_loads_a_given_bundle_before_running(unloadable_bundle, capsys, monkeypatch):
    def never(quick, seeds, bundle):
        raise AssertionError("the benchmark started before its bundle was loaded")

    monkeypatch.setattr("thinkmem_ros.bench.latency.run", never)
    code, err = run(capsys, "bench", "latency", "--bundle", unloadable_bundle)
    assert_one_line(code, err, "--bundle", "ONNX Runtime cannot load the model")


def test_consolidator_loads_its_initial_bundle_before_serving(unloadable_bundle, signing_key,
                                                             tmp_path, capsys):
    code, err = run(capsys, "consolidator", "--signing-key", signing_key, "--db",
                    tmp_path / "c.db", "--initial-bundle", unloadable_bundle,
                    "--bind", "tcp://127.0.0.1:*", "--curve", "off")
    assert_one_line(code, err, "thinkmem consolidator:", "ONNX Runtime cannot load the model")


def test_train_refuses_an_augmentation_that_cannot_fit(capsys, tmp_path):
    code, err = run(capsys, "train", "--bag", REAL / "husky_outdoor.bag", "--labels",
                    REAL / "husky_rules.yaml", "--params", REAL / "husky_params.yaml",
                    "--augment", "100000000", "--out", tmp_path / "b", "--no-progress")
    assert_one_line(code, err, "--augment", "[0, 256]")
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("argv, says", [
    (["--delay", "1e12"], "delay_s must be in [0,"), (["--rate", "1e-300"], "rate must be in"),
    (["--clock", "1e-300"], "clock_hz must be in"), (["--clock", "1e12"], "clock_hz must be in"),
    (["--wait-for-subscribers", "1e30"], "wait_for_subscribers_s must be in [0,"),
], ids=["delay", "slow-rate", "slow-clock", "fast-clock", "endless-wait"])
def test_bag_play_refuses_timing_it_cannot_keep(tmp_path, capsys, argv, says):
    """Extreme speeds overflowed the clock mid-play or published no /clock tick at all."""
    code, err = run(capsys, "bag", "play", REAL / "husky_outdoor.bag", *argv)
    assert_one_line(code, err, "thinkmem bag play: error:", says)


@pytest.mark.parametrize("option", [["--serial", "5"], ["--chain", "x.json"],
                                    ["--signing-key", "a.sign.key"]],
                         ids=["serial", "chain", "signing-key"])
def test_keys_rotation_options_without_a_rotation(tmp_path, capsys, option):
    code, err = run(capsys, "keys", "--out", tmp_path / "k", *option)
    assert_one_line(code, err, "thinkmem keys:", option[0], "only with --rotate")
    assert not (tmp_path / "k").exists()


@pytest.mark.parametrize("shared", ["db", "publish", "db-symlink"])
def test_a_second_consolidator_on_one_store_or_publish_folder_is_refused(tmp_path, signing_key,
                                                                        capsys, shared):
    """Two consolidators staged the same version: one failed mid-round, leftovers stayed.

    Through a symlink to the store (``links/alias.db -> ../c.db``) the second one ran.
    """
    from thinkmem_ros.consolidator.round_lock import RoundLock
    from thinkmem_ros.consolidator.store import ExperienceStore

    db, publish = tmp_path / "c.db", tmp_path / "pub"
    other_db, other_publish = {"db": (db, tmp_path / "pub2"),
                               "publish": (tmp_path / "c2.db", publish),
                               "db-symlink": (tmp_path / "links" / "alias.db",
                                              tmp_path / "pub2")}[shared]
    if shared == "db-symlink":
        ExperienceStore(db).close()
        other_db.parent.mkdir()
        other_db.symlink_to(Path("..") / "c.db")
    ExperienceStore(other_db).close()
    with RoundLock(db, publish):  # the running one
        code, err = run(capsys, "consolidator", "--once", "--signing-key", signing_key,
                        "--db", other_db, "--publish-dir", other_publish)
    assert_one_line(code, err, "thinkmem consolidator:", "another consolidator runs rounds")


def test_the_round_lock_holds_across_processes_and_dies_with_its_holder(tmp_path):
    import subprocess

    from thinkmem_ros.consolidator.round_lock import RoundLock, RoundLockError

    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from thinkmem_ros.consolidator.round_lock "
         "import RoundLock; RoundLock(sys.argv[1], sys.argv[2]); print('held', flush=True); "
         "time.sleep(60)", str(tmp_path / "c.db"), str(tmp_path / "pub")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RoundLockError, match="the store"):
            RoundLock(tmp_path / "c.db", tmp_path / "pub")
    finally:
        holder.kill()
        holder.wait()
    RoundLock(tmp_path / "c.db", tmp_path / "pub").release()  # a killed holder frees it
