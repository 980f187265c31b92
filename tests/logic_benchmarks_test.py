"""Tests of the ZebraLogic and AutoLogi loaders on fixtures in their formats."""

import itertools
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sat_jax import io_utils
from sat_jax.tasks import base
from sat_jax.tasks import logic_benchmarks as lb
from sat_jax.tasks import registry

ZEBRA_2x2 = {
    "id": "lgp-test-2x2-0",
    "size": "2*2",
    "puzzle": (
        "There are 2 houses, numbered 1 to 2 from left to right, as seen from"
        " across the street. Each house is occupied by a different person.\n"
        " - Each person has a unique name: `Eric`, `Arnold`\n"
        " - Each person has a unique favorite drink: `water`, `milk`\n\n"
        "## Clues:\n1. Eric is directly left of the one who only drinks milk.\n"
    ),
    "solution": {
        "header": ["House", "Name", "Drink"],
        "rows": [["1", "Eric", "water"], ["2", "Arnold", "milk"]],
    },
    "created_at": "2024-07-03T21:21:29.478926",
}
ZEBRA_3x3 = {
    "id": "lgp-test-3x3-7",
    "size": "3*3",
    "puzzle": "There are 3 houses ... (clues)",
    "solution": {
        "header": ["House", "Name", "Pet", "Color"],
        "rows": [
            ["1", "Peter", "cat", "red"],
            ["2", "Eric", "dog", "green"],
            ["3", "Arnold", "fish", "blue"],
        ],
    },
    "created_at": "2024-07-03T21:21:29.478926",
}


def _jsonl(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return path


def _grid(rows, header):
  return {f"House {r[0]}": dict(zip(header[1:], r[1:])) for r in rows}


def test_zebralogic_formats_prompt_and_scores(tmp_path):
  rows = [ZEBRA_2x2, ZEBRA_3x3]
  files = [
      _jsonl(tmp_path / "grid.jsonl", rows),
      tmp_path / "grid.json",
      tmp_path / "grid.parquet",
  ]
  files[1].write_text(json.dumps(rows))
  pq.write_table(pa.Table.from_pylist(rows), files[2])
  loaded = [registry.get_task("zebralogic", path=f).load("test") for f in files]
  assert loaded[0] == loaded[1] == loaded[2]
  small, big = loaded[0]
  assert small.uid == "zebralogic/lgp-test-2x2-0" and big.meta["size"] == "3*3"
  assert small.prompt.startswith(ZEBRA_2x2["puzzle"])
  assert '"House 1": {"Name": "...", "Drink": "..."}' in small.prompt
  task = lb.ZebraLogicTask(files[0])
  header, gold = ZEBRA_3x3["solution"]["header"], ZEBRA_3x3["solution"]["rows"]
  answer = {"reasoning": "...", "solution": _grid(gold, header)}
  v = base.score_text(task, big, "Thinking...\n" + json.dumps(answer))
  assert v.correct and task.extra_scores(big, v) == {"cell_accuracy": 1.0}
  # Peter and Eric swapped: 2 of 9 cells wrong.
  answer["solution"]["House 1"]["Name"] = "Eric"
  answer["solution"]["House 2"]["Name"] = "Peter"
  v = base.score_text(task, big, json.dumps(answer))
  assert not v.correct and task.extra_scores(big, v)["cell_accuracy"] == (
      pytest.approx(7 / 9)
  )


def test_zebralogic_bad_files(tmp_path):
  masked = json.loads(json.dumps(ZEBRA_2x2))
  masked["solution"]["rows"] = [["1", "___", "___"], ["2", "___", "___"]]
  with pytest.raises(io_utils.DataFileError, match="masked"):
    lb.ZebraLogicTask(_jsonl(tmp_path / "m.jsonl", [masked])).load()
  no_solution = {k: v for k, v in ZEBRA_2x2.items() if k != "solution"}
  with pytest.raises(
      io_utils.DataFileError, match=r"x.jsonl:2: missing.*solution"
  ):
    lb.ZebraLogicTask(
        _jsonl(tmp_path / "x.jsonl", [ZEBRA_2x2, no_solution])
    ).load()
  bad_header = json.loads(json.dumps(ZEBRA_2x2))
  bad_header["solution"]["header"][0] = "Home"
  with pytest.raises(io_utils.DataFileError, match="record 1: header"):
    lb.ZebraLogicTask(_jsonl(tmp_path / "h.jsonl", [bad_header])).load()
  (tmp_path / "e.json").write_text("[]")
  with pytest.raises(io_utils.DataFileError, match="empty"):
    lb.ZebraLogicTask(tmp_path / "e.json").load()
  (tmp_path / "b.json").write_text('[{"id": 1,\n "size": }]')
  with pytest.raises(io_utils.DataFileError, match=r"b.json:2: malformed"):
    lb.ZebraLogicTask(tmp_path / "b.json").load()
  (tmp_path / "grid.csv").write_text("id,size\n")
  with pytest.raises(io_utils.DataFileError, match="unknown format"):
    lb.ZebraLogicTask(tmp_path / "grid.csv").load()


# Seats 1-3 for A, B, C with A left of B and C not in seat 3: exactly
# {A: 1, B: 3, C: 2} and {A: 2, B: 3, C: 1} satisfy it.
INPUTS_CHECK = """def inputs_check(inputs):
    if not isinstance(inputs, dict):
        return False
    if set(inputs.keys()) != {"A", "B", "C"}:
        return False
    if sorted(inputs.values()) != [1, 2, 3]:
        return False
    return True"""
CONSTRAINTS = """def constraint_1(inputs):
    return inputs["A"] < inputs["B"]

def constraint_2(inputs):
    return inputs["C"] != 3

constraint_list = [constraint_1, constraint_2]"""
TRAVERSE = """def count_valid_arrangements():
    import itertools
    count = 0
    for seats in itertools.permutations([1, 2, 3]):
        inputs = dict(zip("ABC", seats))
        if verify_function(inputs, inputs_check, constraint_list):
            count += 1
    return count, 6"""


def _autologi_record(idx, constraints=CONSTRAINTS):
  return {
      "idx": idx,
      "prompt": (
          "A, B and C take seats 1, 2 and 3. A sits left of B; C is not in"
          " seat 3. Give the seats as a dict, e.g. {'A': 1, 'B': 2, 'C': 3}."
      ),
      "lang": "en",
      "code": {
          "Inputs_Check_code": INPUTS_CHECK,
          "Constraint_List_code": constraints,
          "Traverse_code": TRAVERSE,
      },
  }


def test_autologi_extraction_rules():
  ex = lb.extract_autologi_answer
  assert ex("x {'A': 1} y\n```python\n{'A': 2}\n```\nz {'A': 3}") == "{'A': 2}"
  assert ex("first {'A': 1}, then {'A': {'x': 2}} done") == "{'A': {'x': 2}}"
  assert ex("the order is [1, [2, 3]] ok") == "[1, [2, 3]]"
  assert ex("{'a': 1} and [2]") == "{'a': 1}"  # a dict before any list
  assert ex("no literal here") is None
  parse = lb.parse_autologi_answer
  assert parse("{'x': true, 'y': false}") == {"x": True, "y": False}
  assert parse("{'A': 1, // first\n 'B': 3}") == {"A": 1, "B": 3}
  assert parse("inputs = {'A': 1}") == {"A": 1}
  assert parse('{"A": null}') == {"A": None}  # JSON, after literal_eval fails
  with pytest.raises(ValueError, match="literal"):
    parse("{'A': f(1)}")


def test_autologi_verdicts(tmp_path):
  path = _jsonl(tmp_path / "AutoLogi_en.jsonl", [_autologi_record(0)])
  task = registry.get_task("autologi", path=path)
  (ex,) = task.load("test")
  assert ex.uid == "autologi/0" and ex.meta == {"lang": "en"}
  # Independent count: of the 6 seatings exactly the 2 by hand are accepted.
  accepted = [
      p
      for p in itertools.permutations([1, 2, 3])
      if base.score_text(task, ex, repr(dict(zip("ABC", p)))).correct
  ]
  assert accepted == [(1, 3, 2), (2, 3, 1)]
  cases = {
      "```python\n{'A': 1, 'B': 3, 'C': 2}\n```": (True, ""),
      'Answer:\n```json\n{"A": 2, "B": 3, "C": 1}\n```': (True, ""),
      "```\ninputs = {'A': 1, 'B': 3, 'C': 2}\n```": (True, ""),
      "{'A': 1, 'B': 2, 'C': 3}": (False, "constraints not satisfied"),
      "{'A': 1}": (False, "constraints not satisfied"),  # fails inputs_check
      "{'A': oops}": (False, "not a Python/JSON literal"),
  }
  for text, (ok, reason) in cases.items():
    v = base.score_text(task, ex, text)
    assert v.correct == ok and reason in v.reason, (text, v)
  assert task.answer_key("{'A': 1, 'B': 3}") == task.answer_key(
      '{"B": 3, "A": 1}'
  )


def test_autologi_verifier_errors_and_timeouts_are_wrong(tmp_path):
  crashing = CONSTRAINTS.replace(
      'return inputs["C"] != 3', 'return 10 / (inputs["A"] - 1) > 0'
  )
  looping = CONSTRAINTS.replace('return inputs["C"] != 3', "while True: pass")
  path = _jsonl(
      tmp_path / "a.jsonl",
      [_autologi_record(1, crashing), _autologi_record(2, looping)],
  )
  task = lb.AutoLogiTask(path, timeout_s=1.0)
  crash, loop = task.load()
  v = base.score_text(task, crash, "{'A': 1, 'B': 3, 'C': 2}")
  assert not v.correct and "ZeroDivisionError" in v.reason
  assert base.score_text(task, crash, "{'A': 2, 'B': 3, 'C': 1}").correct
  v = base.score_text(task, loop, "{'A': 1, 'B': 3, 'C': 2}")
  assert not v.correct and "timed out after 1 s" in v.reason


def test_autologi_bad_files(tmp_path):
  record = _autologi_record(0)
  del record["code"]["Constraint_List_code"]
  with pytest.raises(io_utils.DataFileError, match="record 1: code needs"):
    lb.AutoLogiTask(_jsonl(tmp_path / "a.jsonl", [record])).load()
  (tmp_path / "b.jsonl").write_text('{"idx": 0, "prompt": "p"}\n')
  with pytest.raises(io_utils.DataFileError, match=r"b.jsonl:1: missing.*code"):
    lb.AutoLogiTask(tmp_path / "b.jsonl").load()
  with pytest.raises(ValueError, match="timeout_s"):
    lb.AutoLogiTask(tmp_path / "b.jsonl", timeout_s=0)
