"""End-to-end tests of `sat-jax eval` on a tiny saved team.

The command runs in a subprocess (its absl flags would clash with other
commands' in one process). Its metrics are recomputed here from its own
predictions with independent code: pass@k from binomial coefficients, the
vote by counting.
"""

import collections
import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import jax

from sat_jax import config as config_lib
from sat_jax import models
from sat_jax import sharding
from sat_jax import testing
from sat_jax import train

_TESTS = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(_TESTS))
import train_e2e_test as e2e  # pylint: disable=g-import-not-at-top,wrong-import-position

tiny_model = e2e.tiny_model  # the session fixture

# `sat-jax eval` with the parity test task registered first.
_LAUNCH = (
    f"import sys; sys.path.insert(0, {str(_TESTS)!r}); import train_e2e_test;"
    " from sat_jax import main; main.run(['sat-jax', 'eval'] + sys.argv[1:])"
)


def _eval(*args: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, XLA_FLAGS="")  # one CPU device
  return subprocess.run(
      [sys.executable, "-c", _LAUNCH, *args],
      capture_output=True,
      text=True,
      timeout=900,
      env=env,
  )


@pytest.fixture(scope="module")
def saved_team(tiny_model, tmp_path_factory) -> pathlib.Path:
  """A run directory holding the starting team (stage 0) only."""
  workdir = tmp_path_factory.mktemp("run")
  config = e2e.tiny_train_config(
      *tiny_model,
      num_stages=0,
      eval=config_lib.EvalConfig(num_problems=0, k=2, batch_size=2),
  )
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
  train.train_and_evaluate(config, workdir, mesh, progress=False)
  return workdir


def _rows(out: pathlib.Path) -> list[dict]:
  lines = (out / "predictions.jsonl").read_text().splitlines()
  return [json.loads(line) for line in lines]


def _pass_at_k(n: int, c: int, k: int) -> float:
  return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["relay", "vote"])
def test_eval_metrics_follow_from_its_predictions(
    saved_team, tmp_path, protocol
):
  out = tmp_path / protocol
  done = _eval(
      f"--workdir={saved_team}",
      "--k=3",
      "--num_problems=4",
      f"--protocol={protocol}",
      f"--out={out}",
  )
  assert done.returncode == 0, done.stderr[-3000:]
  summary = json.loads((out / "summary.json").read_text())
  rows = _rows(out)
  assert summary["k"] == 3 and summary["num_problems"] == 4
  assert (
      summary["meta"]["step"] == 0 and summary["meta"]["protocol"] == protocol
  )
  assert len(rows) == 4 * 3
  by_uid = collections.defaultdict(list)
  for r in rows:
    by_uid[r["uid"]].append(r)
    agent_texts = [m["text"] for m in r["transcript"] if m["speaker"] != "task"]
    assert len(agent_texts) == 3
    if protocol == "relay":  # the team answer is the last message
      assert r["text"] == agent_texts[-1]
    else:  # the majority of the three parities (no ties with 3 voters)
      votes = collections.Counter(str(len(t) % 2) for t in agent_texts)
      assert r["answer"] == votes.most_common(1)[0][0]
    assert r["correct"] == (len(r["text"]) % 2 == 0)
  correct = {u: [r["correct"] for r in rs] for u, rs in by_uid.items()}
  assert summary["avg@3"] == pytest.approx(
      np.mean([np.mean(c) for c in correct.values()])
  )
  for j in (1, 2, 3):
    assert summary[f"pass@{j}"] == pytest.approx(
        np.mean([_pass_at_k(3, sum(c), j) for c in correct.values()])
    )
  maj = []
  for rs in by_uid.values():
    votes = collections.Counter(r["answer"] for r in rs)
    maj.append(votes.most_common(1)[0][0] == "0")
  assert summary["maj@3"] == pytest.approx(np.mean(maj))
  assert (out / "summary.md").read_text().startswith("| task |")


def test_a_wrong_run_directory_is_a_clear_error(tmp_path):
  with pytest.raises(FileNotFoundError, match="no such directory"):
    train.load_run_config(tmp_path / "nope")
  with pytest.raises(FileNotFoundError, match="not a `sat-jax train` run"):
    train.load_run_config(tmp_path)
  (tmp_path / "config.json").write_text("{}")
  with pytest.raises(FileNotFoundError, match="no checkpoints/ folder"):
    train.load_run_config(tmp_path)


@pytest.mark.slow
def test_eval_rejects_a_missing_run_or_step(saved_team, tmp_path):
  done = _eval(f"--workdir={tmp_path / 'nope'}")
  assert done.returncode != 0
  assert "no such directory" in done.stderr
  done = _eval(f"--workdir={saved_team}", "--step=7")
  assert done.returncode != 0
  assert "no step 7" in done.stderr and "[0]" in done.stderr


# The command's absl flags clash with other commands' in this process: its
# pure helpers run in one fresh interpreter per test, one call per case.
_CALL_EACH = """
import json, sys
from sat_jax.commands import eval as eval_command
fn = getattr(eval_command, sys.argv[1])
out = []
for args in json.loads(sys.argv[2]):
  try:
    out.append({"value": fn(*args)})
  except ValueError as e:
    out.append({"error": str(e)})
print(json.dumps(out))
"""


def _call_each(name: str, cases: list) -> list[dict]:
  """eval_command.<name>(*args) for each (args, want) of `cases`."""
  done = subprocess.run(
      [
          sys.executable,
          "-c",
          _CALL_EACH,
          name,
          json.dumps([c for c, _ in cases]),
      ],
      capture_output=True,
      text=True,
      timeout=300,
      check=True,
  )
  return json.loads(done.stdout.strip().splitlines()[-1])


def _check_errors(name: str, cases: list) -> None:
  """Each case raises a ValueError starting with its want, or (None) not."""
  for (case, want), got in zip(cases, _call_each(name, cases)):
    if want is None:
      assert "error" not in got, (case, got)
    else:
      assert got.get("error", "").startswith(want), (case, got)


def test_eval_rejects_meaningless_counts(tmp_path):
  _check_errors(
      "check_counts",
      [
          ((0, 0, None), "--k=0: must be >= 1"),
          ((-5, 0, None), "--k=-5: must be >= 1"),
          ((None, -1, None), "--num_problems=-1: must be >= 0"),
          ((None, 0, 0), "--batch_size=0: must be >= 1"),
          ((1, 0, 1), None),
          ((None, 5, None), None),
      ],
  )
  # main checks them before it reads the run directory (here: none).
  done = _eval(f"--workdir={tmp_path / 'nope'}", "--num_problems=-1")
  assert done.returncode != 0
  assert "ValueError: --num_problems=-1: must be >= 0" in done.stderr
  assert "no such directory" not in done.stderr


def test_eval_rejects_incomplete_product_flags(tmp_path):
  _check_errors(
      "check_product_flags",
      [
          ((1, None, None), "--product_agent needs --product_model"),
          ((None, "/m", None), "--product_model needs --product_agent"),
          ((None, None, 0.1), "--product_delta needs --product_agent"),
          ((None, "/m", 0.1), "--product_model needs --product_agent"),
          ((1, "/m", None), None),
          ((1, "/m", 0.1), None),
          ((None, None, None), None),
      ],
  )
  done = _eval(f"--workdir={tmp_path / 'nope'}", "--product_model=/m")
  assert done.returncode != 0
  assert "--product_model needs --product_agent" in done.stderr
  assert "no such directory" not in done.stderr


@pytest.mark.slow  # three evaluations; the default suite has
# tests/stage0_product_team_test.py for the same path in-process.
def test_a_product_slot_at_zero_radius_evaluates_like_the_team(
    saved_team, tmp_path
):
  # Stage 0 at decoding time: with delta0 = 0 the product of experts is the
  # slot's own model, so the predictions match the plain team's exactly.
  config = testing.tiny_config("qwen3", num_layers=1, hidden_size=48)
  params = jax.jit(models.init_params, static_argnums=0)(
      config, jax.random.key(11)
  )
  params = jax.tree.map(lambda x: x * 4 if x.ndim >= 2 else x, params)
  models.save_hf(tmp_path / "pre", config, params)

  def rows(name: str, *product: str) -> list[dict]:
    out = tmp_path / name
    done = _eval(
        f"--workdir={saved_team}",
        "--k=2",
        "--num_problems=2",
        f"--out={out}",
        *product,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return _rows(out)

  plain = rows("plain")
  pre = ("--product_agent=1", f"--product_model={tmp_path / 'pre'}")
  assert rows("product", *pre, "--product_delta=0") == plain
  # A wide ball lets the other model speak in slot 1.
  assert rows("wide", *pre, "--product_delta=1000") != plain
  meta = json.loads((tmp_path / "product" / "summary.json").read_text())["meta"]
  assert meta["product"] == {
      "agent": 1,
      "model": str(tmp_path / "pre"),
      "delta0": 0.0,
  }


def test_default_out_names_keep_different_evaluations_apart():
  cases = [
      (("arith", "test", 3, None, None, 0), "arith_step3"),
      (("arith", "train", 3, None, None, 0), "arith_train_step3"),
      (("arith", "test", 3, "vote", None, 0), "arith_step3_vote"),
      (("arith", "test", 0, None, 1, 0), "arith_step0_product1"),
      (
          ("arith", "dev", 2, "solo", 0, 5),
          "arith_dev_step2_solo_product0_seed5",
      ),
  ]
  got = _call_each("default_out_name", cases)
  assert got == [{"value": want} for _, want in cases]
