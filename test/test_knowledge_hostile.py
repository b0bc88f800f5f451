"""Knowledge rows another program damaged: refused as a malformed unit, never passed on.

Each case writes one real unit into a real SQLite store, overwrites one column, and reads
it back through the store and through ``thinkmem knowledge list`` in-process: the store
raises :class:`KnowledgeStoreError` naming the file, the command prints one line and exits 2.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from cli_checks import assert_one_line, run

from thinkmem_ros import cli
from thinkmem_ros.consolidator.knowledge import (
    KnowledgeStore,
    KnowledgeStoreError,
    KnowledgeUnit,
)


def _knowledge_db(path: Path, **column) -> Path:
    """A store with one knowledge unit, one column overwritten with a damaged value."""
    with KnowledgeStore(path) as store:
        store.save([KnowledgeUnit(pattern=("a", "b", "c"), relation="sequence3",
                                  constraints={"min_gap": 0.0}, thinking="consider:c",
                                  confidence=0.9, status="promoted")])
    with sqlite3.connect(path) as conn:
        for name, value in column.items():
            conn.execute(f"UPDATE knowledge_units SET {name} = ?", (value,))
    return path


def _refusals(db: Path, capsys) -> tuple[str, list[tuple[int, str]]]:
    """The store's error text, and (exit code, stderr) of both listings."""
    with KnowledgeStore(db, read_only=True) as store, \
            pytest.raises(KnowledgeStoreError, match="malformed knowledge unit") as caught:
        store.load()
    return str(caught.value), [run(capsys, "knowledge", "list", "--db", db, *extra)
                               for extra in ([], ["--json"])]


def _names_all(db: Path, message: str, listings, *names: str) -> bool:
    """The store named the file and the problem; both listings one line with exit 2."""
    for code, err in listings:
        assert_one_line(code, err, "thinkmem knowledge:", db.name, *names)
    return (all(name in message for name in (db.name, *names))
            and all(code == 2 for code, _ in listings))


def test_an_intact_unit_lists_as_strict_json(tmp_path, capsys):
    db = _knowledge_db(tmp_path / "k.db")
    assert cli.main(["knowledge", "list", "--db", str(db), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out, parse_constant=_no_constant)
    assert listed[0]["constraints"] == {"min_gap": 0.0}


def _no_constant(token):
    raise AssertionError(f"the listing holds {token}")


# ------------------------------------------------------------------ non-standard numbers

@pytest.mark.parametrize("column", [
    {"constraints": '{"min_gap": NaN, "max_gap": Infinity}'},
    {"constraints": '{"max_gap": -Infinity}'},
    {"constraints": '{"max_gap": 1e400}'},
    {"history": '[[1, NaN, 0.5, "candidate"]]'},
], ids=["nan", "minus-infinity", "float-overflow", "history-nan"])
def test_nan_and_infinity_are_a_malformed_unit(tmp_path, capsys, column):
    """Python's decoder took them, and ``--json`` printed invalid JSON with exit 0."""
    db = _knowledge_db(tmp_path / "k.db", **column)
    message, listings = _refusals(db, capsys)
    assert _names_all(db, message, listings, next(iter(column)), "finite"), message


# ------------------------------------------------------------------ nesting past the stack

@pytest.mark.parametrize("column", [
    {"pattern": "[" * 100_000 + "]" * 100_000},
    {"constraints": '{"a":' * 5_000 + "1" + "}" * 5_000},
    {"history": "[" * 100_000 + "]" * 100_000},
], ids=["pattern", "constraints", "history"])
def test_json_nested_past_the_stack_is_a_malformed_unit(tmp_path, capsys, column):
    """It was a RecursionError at the command's last net: exit 1, no file or column."""
    db = _knowledge_db(tmp_path / "k.db", **column)
    message, listings = _refusals(db, capsys)
    assert _names_all(db, message, listings, next(iter(column)), "nested too deeply"), message


@pytest.fixture
def signing_key(tmp_path, capsys):
    assert cli.main(["keys", "--out", str(tmp_path / "keys"), "--name", "c"]) == 0
    capsys.readouterr()
    return tmp_path / "keys" / "c.sign.key"


def test_consolidator_once_names_the_store_with_deeply_nested_knowledge(tmp_path, capsys,
                                                                        signing_key):
    db = _knowledge_db(tmp_path / "deep.db", pattern="[" * 100_000 + "]" * 100_000)
    code, err = run(capsys, "consolidator", "--once", "--signing-key", signing_key,
                    "--db", db, "--publish-dir", tmp_path / "pub")
    assert code == 2, err
    assert_one_line(code, err, "thinkmem consolidator:", str(db), "pattern",
                    "nested too deeply")


# ------------------------------------------------------------------ rows that passed silently

@pytest.mark.parametrize("column, names", [
    ({"relation": "sequence9; DROP"}, ("relation", "sequence3")),
    ({"relation": "sequence2"}, ("relation", "sequence3")),
    ({"key": "zzz"}, ("key", "zzz")),
    ({"history": '[[1, 0.5, 0.5, "promoted"], []]'}, ("history entry",)),
    ({"history": '[[1, 0.5, "x"]]'}, ("history entry",)),
    ({"history": '[[true, 0.5, 0.5, "promoted"]]'}, ("history entry",)),
    ({"history": '[[1, 2.5, 0.5, "promoted"]]'}, ("history entry",)),
    ({"history": '[[1, 0.5, 0.5, "bogus"]]'}, ("history entry",)),
    ({"pattern": json.dumps([f"e{i}" for i in range(500)])}, ("pattern", "500 events")),
    ({"pattern": json.dumps(["a", "b", "E" * 10_000])}, ("pattern", "not a name")),
    ({"pattern": '["a", "b", "c; rm"]'}, ("pattern", "not a name")),
    ({"pattern": '["a", "b", "a"]'}, ("pattern", "repeats")),
], ids=["unknown-kind", "kind-of-another-length", "key", "empty-entry", "short-entry",
        "bool-round", "support-above-one", "unknown-status", "500-events", "huge-name",
        "name-no-record-carries", "repeated-event"])
def test_a_row_at_odds_with_itself_is_a_malformed_unit(tmp_path, capsys, column, names):
    db = _knowledge_db(tmp_path / "k.db", **column)
    message, listings = _refusals(db, capsys)
    assert _names_all(db, message, listings, *names), message


def test_the_history_a_round_writes_reads_back(tmp_path):
    """The checks refuse damage only: a unit's own rounds, demotion included, load intact."""
    from thinkmem_ros.consolidator.knowledge import KnowledgeConfig

    unit = KnowledgeUnit(pattern=("a", "b"), relation="sequence2", constraints={},
                         thinking="consider:b")
    for round_index, support in enumerate((1.0, 1.0, 0.0, 0.0, 0.0)):
        unit.update(support, round_index, KnowledgeConfig())
    with KnowledgeStore(tmp_path / "k.db") as store:
        store.save([unit])
        assert store.units()["a>b"].history == unit.history


def test_a_key_that_disagreed_no_longer_hides_the_better_row(tmp_path):
    """Why the key is checked: saving the same pattern again added a second row beside the
    damaged key, and ``units()`` kept the lower-confidence one of the two."""
    db = _knowledge_db(tmp_path / "k.db", key="zzz")
    better = KnowledgeUnit(pattern=("a", "b", "c"), relation="sequence3", constraints={},
                           thinking="consider:c", confidence=0.95, status="promoted")
    with KnowledgeStore(db) as store:
        store.save([better])
        with pytest.raises(KnowledgeStoreError, match="key 'zzz'"):
            store.units()


def test_an_empty_file_is_no_store_to_list(tmp_path, capsys):
    """SQLite opens a 0-byte file as an empty database; "no knowledge units" with exit 0
    would tell whoever named the wrong file that the consolidator found nothing."""
    empty = tmp_path / "consolidator.sqlite"
    empty.touch()
    code, err = run(capsys, "knowledge", "list", "--db", empty)
    assert_one_line(code, err, "thinkmem knowledge:", empty.name, "no consolidator store")
    assert code == 2
    assert empty.stat().st_size == 0  # looking wrote nothing
