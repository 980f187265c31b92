"""Tests of the evaluation loop with a scripted generate_fn (hand metrics)."""

import json

import jax
import numpy as np
import pytest

from sat_jax.eval import runner
from sat_jax.tasks import arithmetic
from sat_jax.tasks import base
from sat_jax.tasks import zebra


class _RaisingArithmetic(arithmetic.ArithmeticTask):
  """Arithmetic whose verifier crashes on the answer 666."""

  def check(self, example, answer):
    if answer == "666":
      raise RuntimeError("verifier bug")
    return super().check(example, answer)


def _examples():
  pairs = [(100, 200), (450, 55), (999, 1)]
  return [
      base.Example(
          f"arithmetic/{a}+{b}",
          f"Compute {a}+{b}.",
          str(a + b),
          {"a": a, "b": b, "op": "+"},
      )
      for a, b in pairs
  ]


# Per problem, K=4 team answers. P0: all right. P1: one right, the 3 wrong
# ones agree (majority wrong). P2: no answer, a crashing answer, two equal
# wrong answers.
SCRIPT = {
    "arithmetic/100+200": ["Answer: 300"] * 4,
    "arithmetic/450+55": [
        "Answer: 100",
        "Answer: 100",
        "Answer: 505",
        "Answer: 100",
    ],
    "arithmetic/999+1": ["no idea", "Answer: 666", "Answer: 5", "Answer: 5"],
}


def test_runner_metrics_files_and_keys_by_hand(tmp_path, capsys, caplog):
  seen_keys = []

  def generate_fn(batch, k, key):
    seen_keys.append(np.asarray(jax.random.key_data(key)))
    return [
        [
            runner.TeamSample(
                t, agent_texts=(f"Answer: {e.target}", "Answer: 1")
            )
            for t in SCRIPT[e.uid][:k]
        ]
        for e in batch
    ]

  task = _RaisingArithmetic(data_dir="unused")
  key = jax.random.key(7)
  summary = runner.evaluate(
      task, _examples(), generate_fn, 4, key, tmp_path, batch_size=2
  )
  assert summary["num_problems"] == 3 and summary["k"] == 4
  assert summary["avg@4"] == pytest.approx((1 + 1 / 4 + 0) / 3)
  assert summary["pass@1"] == pytest.approx(summary["avg@4"])
  # pass@2 of P1: 1 - C(3, 2) / C(4, 2) = 1/2.
  assert summary["pass@2"] == pytest.approx((1 + 1 / 2 + 0) / 3)
  assert summary["pass@4"] == pytest.approx(2 / 3)
  assert summary["maj@4"] == pytest.approx(1 / 3)
  assert summary["no_answer_rate"] == pytest.approx(1 / 12)
  assert summary["verifier_errors"] == 1
  assert summary["mean_reward"] == pytest.approx(5 / 12)
  assert summary["agent0/avg@4"] == 1.0 and summary["agent1/avg@4"] == 0.0
  # Two batches, keyed fold_in(key, 0) and fold_in(key, 1).
  want = [
      np.asarray(jax.random.key_data(jax.random.fold_in(key, b)))
      for b in (0, 1)
  ]
  assert len(seen_keys) == 2
  assert all(np.array_equal(s, w) for s, w in zip(seen_keys, want))
  # Files.
  rows = [json.loads(l) for l in (tmp_path / "predictions.jsonl").open()]
  assert len(rows) == 12
  assert [(r["uid"], r["sample"]) for r in rows[4:8]] == [
      ("arithmetic/450+55", j) for j in range(4)
  ]
  assert [r["correct"] for r in rows[4:8]] == [False, False, True, False]
  crashed = rows[9]
  assert crashed["answer"] == "666" and not crashed["correct"]
  assert crashed["reason"] == "verifier error: RuntimeError: verifier bug"
  assert "verifier raised RuntimeError('verifier bug') on '666'" in caplog.text
  assert rows[8]["answer"] is None and rows[8]["vote_key"] is None
  assert rows[0]["agents"][1] == {
      "answer": "1",
      "correct": False,
      "reason": "1 != 300",
  }
  saved = json.loads((tmp_path / "summary.json").read_text())
  assert saved == json.loads(json.dumps(summary))
  table = (tmp_path / "summary.md").read_text().splitlines()
  assert table[0].startswith("| task | num_problems | k | avg@4 | pass@1 |")
  assert table[2].startswith(
      "| arithmetic | 3 | 4 | 0.4167 | 0.4167 | 0.5000 |"
  )
  assert "eval arithmetic" in capsys.readouterr().err  # the progress bar


def test_multi_turn_verdicts_and_extra_scores(tmp_path):
  table = {"header": ["House", "Name"], "rows": [["1", "Bob"], ["2", "Eve"]]}
  ex = base.Example("zebra/x", "", table)
  right = json.dumps(
      {"solution": {"House 1": {"Name": "Bob"}, "House 2": {"Name": "Eve"}}}
  )
  half = json.dumps({"solution": {"House 1": {"Name": "Bob"}}})
  # The environment's verdict is used as given (the text is not re-scored).
  env_verdict = base.Verdict(0.0, False, half, "out of turns")

  def generate_fn(batch, k, key):
    del key
    return [
        [right, runner.TeamSample(right, verdict=env_verdict)][:k]
        for _ in batch
    ]

  task = zebra.ZebraTask(data_dir="unused")
  summary = runner.evaluate(
      task,
      [ex],
      generate_fn,
      2,
      jax.random.key(0),
      tmp_path,
      progress=False,
      meta={"protocol": "relay"},
  )
  assert summary["avg@2"] == 0.5 and summary["maj@2"] == 1.0
  assert summary["cell_accuracy"] == pytest.approx((1 + 1 / 2) / 2)
  assert summary["meta"] == {"protocol": "relay"}
  rows = [json.loads(l) for l in (tmp_path / "predictions.jsonl").open()]
  assert rows[1]["reason"] == "out of turns"


def test_bad_generate_output_and_arguments(tmp_path):
  task = arithmetic.ArithmeticTask(data_dir="unused")
  exs = _examples()
  key = jax.random.key(0)
  short = lambda batch, k, key: [["Answer: 1"] * (k - 1) for _ in batch]
  with pytest.raises(ValueError, match="3 samples for arithmetic/100\\+200"):
    runner.evaluate(task, exs, short, 4, key, tmp_path, progress=False)
  missing = lambda batch, k, key: [["Answer: 1"] * k]
  with pytest.raises(ValueError, match="1 outputs for 2 examples"):
    runner.evaluate(
        task, exs, missing, 4, key, tmp_path, batch_size=2, progress=False
    )
  ok = lambda batch, k, key: [["Answer: 1"] * k for _ in batch]
  with pytest.raises(ValueError, match="no examples"):
    runner.evaluate(task, [], ok, 4, key, tmp_path)
  with pytest.raises(ValueError, match="k must be"):
    runner.evaluate(task, exs, ok, 0, key, tmp_path)
  with pytest.raises(ValueError, match="pass_ks"):
    runner.evaluate(task, exs, ok, 4, key, tmp_path, pass_ks=[8])
  assert not (tmp_path / "summary.json").exists()


def test_paper_k_defaults():
  assert runner.default_k("aime24") == runner.default_k("aime25") == 64
  assert runner.default_k("zebralogic") == 64
  assert runner.default_k("arbench_gn") == runner.default_k("arbench_dc") == 25
  assert runner.default_k("planbench") == runner.default_k("autologi") == 8
  assert runner.default_k("math500") == 4
  assert runner.default_k("math500", override=16) == 16
  with pytest.raises(ValueError, match="no paper K for task 'arithmetic'"):
    runner.default_k("arithmetic")
  with pytest.raises(ValueError, match="k must be"):
    runner.default_k("aime24", override=0)
