"""Tests of the shared task machinery: synthetic base, turn budget, demos."""

import random

import pytest

from sat_jax.tasks import base
from sat_jax.tasks import datasets
from sat_jax.tasks import episodes
from sat_jax.tasks import registry
from sat_jax.tasks import synthetic


class _Squares(synthetic.SampledTask):
  """Toy problems v in [0, 40): draws of multiples of 7 are rejected by
  `_draw`, multiples of 5 by `_record`."""

  name = "squares"

  def generator_config(self):
    return {"size": 40}

  def _draw(self, rng):
    v = rng.randrange(40)
    return None if v % 7 == 0 else (str(v), v)

  def _record(self, key, drawn):
    if drawn % 5 == 0:
      return None
    return {"prompt": f"{key}^2?", "target": drawn * drawn}

  def extract_answer(self, text):
    return text

  def check(self, example, answer):
    ok = int(answer) == example.target
    return base.Verdict(float(ok), ok, answer)

  def demonstration(self, example):
    return str(example.target)


def _expected_values(seed, split, count):
  """The first `count` distinct values of `split` in the seeded stream."""
  rng, out = random.Random(f"squares/{seed}/{split}"), []
  while len(out) < count:
    v = rng.randrange(40)
    if v % 7 and v % 5 and v not in out:
      if datasets.hash_split(str(v), 0.25) == split:
        out.append(v)
  return out


def test_sampled_task_records_splits_and_storage(tmp_path):
  task = _Squares(
      seed=3, train_size=12, test_size=4, test_fraction=0.25, data_dir=tmp_path
  )
  want = {s: _expected_values(3, s, n) for s, n in (("train", 12), ("test", 4))}
  for split, values in want.items():
    assert task.records(split, len(values)) == [
        {"uid": f"squares/{v}", "prompt": f"{v}^2?", "target": v * v}
        for v in values
    ]
    # The stored order is TFDS's (shuffled by key), the set is the same.
    loaded = task.load(split)
    assert sorted(e.target for e in loaded) == sorted(v * v for v in values)
    assert all(e.prompt == f"{e.uid.split('/')[1]}^2?" for e in loaded)
  # Stored once, under the hash of the parameters, seed and split sizes.
  key = datasets.config_key({
      "config": {"size": 40, "seed": 3, "test_fraction": 0.25},
      "splits": {"train": 12, "test": 4},
  })
  assert [p.name for p in (tmp_path / "squares").iterdir()] == [key]
  # 40 values less 12 multiples of 5 or 7: 28 problems in all.
  small = _Squares(train_size=29, data_dir=tmp_path / "small")
  with pytest.raises(ValueError, match="found only .* distinct train"):
    small.load("train")
  with pytest.raises(ValueError, match="unknown split"):
    task.load("dev")


def test_base_arguments_are_validated():
  with pytest.raises(ValueError, match="squares: train_size must be an int"):
    _Squares(train_size=-1)
  with pytest.raises(ValueError, match="squares: test_size must be an int"):
    _Squares(test_size=2.5)
  with pytest.raises(ValueError, match="squares: test_fraction"):
    _Squares(test_fraction=0.0)


def test_default_data_dir(monkeypatch, tmp_path):
  monkeypatch.setenv("HOME", str(tmp_path))
  monkeypatch.setenv("SAT_JAX_DATA_DIR", "~/data")
  assert synthetic.default_data_dir() == tmp_path / "data"
  monkeypatch.delenv("SAT_JAX_DATA_DIR")
  assert synthetic.default_data_dir() == tmp_path / ".cache/sat_jax/tasks"
  assert _Squares().data_dir == tmp_path / ".cache/sat_jax/tasks"


# Registry names and constructor defaults: trainer configs depend on them.
SPLIT_DEFAULTS = {
    "arithmetic": (1000, 200),
    "countdown": (1000, 200),
    "zebra": (1000, 200),
    "blocksworld": (1000, 100),
    "guess_number": (2000, 200),
    "twenty_questions": (2000, 200),
}


def test_registry_names_and_synthetic_defaults(tmp_path):
  # Other test modules register their own tasks (named "test_*").
  builtin = [n for n in registry.names() if not n.startswith("test_")]
  assert builtin == sorted([
      "aime24", "aime25", "arbench_dc", "arbench_gn", "arbench_sp",
      "arithmetic", "autologi", "blocksworld", "countdown", "guess_number",
      "math500", "planbench", "twenty_questions", "zebra", "zebralogic",
  ])  # fmt: skip
  for name, (train, test) in SPLIT_DEFAULTS.items():
    task = registry.get_task(name)
    assert task.split_sizes == {"train": train, "test": test}, name
    assert (task.seed, task.test_fraction) == (0, 0.2), name
    task = registry.get_task(
        name, seed=4, train_size=5, test_size=2, test_fraction=0.5,
        data_dir=tmp_path,
    )  # fmt: skip
    assert task.split_sizes == {"train": 5, "test": 2}, name
    assert (task.seed, task.test_fraction, task.data_dir) == (4, 0.5, tmp_path)


def test_single_turn_demonstration_messages():
  task = registry.get_task("arithmetic", data_dir="unused")
  ex = base.Example("a/1+2", "Compute 1+2.", "3", {"a": 1, "b": 2, "op": "+"})
  assert task.demonstration_messages(ex) == [
      {"role": "user", "content": "Compute 1+2."},
      {"role": "assistant", "content": "1+2+0=3\nAnswer: 3"},
  ]
  math = registry.get_task("math500", path="unused.jsonl")
  with pytest.raises(ValueError, match="provides no demonstrations"):
    math.demonstration_messages(base.Example("m", "p", "1"))


class _Echo(episodes.TurnBudgetEnv):
  """Replies "ok"; "stop" ends the episode within a turn."""

  kind = "echo"

  def _final(self, message):
    if message.startswith("Final answer: "):
      return message[len("Final answer: ") :]
    return message.upper() if self.awaiting_final else None

  def _turn(self, message):
    self.done = message == "stop"
    return "stopped" if self.done else "ok"

  def verdict(self):
    return base.Verdict(float(self.answer == "X"), self.answer == "X")


def test_turn_budget_episode():
  env = _Echo(max_turns=2)
  assert env.step("a") == base.EnvReply("ok", False)
  r = env.step("b")
  assert r == base.EnvReply(
      "ok No questions left. Reply with: Final answer: ...", False
  )
  assert env.awaiting_final and env.turns == 2
  assert env.step("x") == base.EnvReply(None, True)  # read leniently
  assert env.answer == "X" and env.verdict().correct
  with pytest.raises(RuntimeError, match="echo: step.. after the episode"):
    env.step("a")
  env.reset()
  assert (env.turns, env.done, env.answer) == (0, False, None)
  assert env.step("Final answer: y") == base.EnvReply(None, True)
  env.reset()
  assert env.step("stop") == base.EnvReply("stopped", True)
  with pytest.raises(ValueError, match="max_turns"):
    _Echo(max_turns=0)


def test_scripted_episode_messages():
  env = _Echo(max_turns=1)
  moves = iter(["a", "x"])
  messages = episodes.scripted_episode("Go.", env, lambda: next(moves))
  assert messages == [
      base.message("user", "Go."),
      base.message("assistant", "a"),
      base.message(
          "user", "ok No questions left. Reply with: Final answer: ..."
      ),
      base.message("assistant", "x"),  # the closing reply is None: no message
  ]
  assert env.done and env.verdict().correct
