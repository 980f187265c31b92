"""Tests of the active-reasoning tasks: guess-the-number, twenty questions."""

import json

import pytest

from sat_jax.io_utils import DataFileError
from sat_jax.tasks import base
from sat_jax.tasks import datasets
from sat_jax.tasks import guess_number as gn
from sat_jax.tasks import registry
from sat_jax.tasks import twenty_questions as tq

# AR-Bench's own worked example (gn/prompt.py, few-shot "Example 1"): target
# 6850, each guess with the feedback printed there.
ARBENCH_EXAMPLE = [
    ("1234", 0, 0), ("5678", 0, 3), ("1678", 0, 2), ("5178", 0, 2),
    ("5618", 0, 3), ("5689", 0, 3), ("5680", 1, 3), ("8650", 2, 2),
    ("8560", 1, 3), ("6850", 4, 0),
]  # fmt: skip


def test_feedback_rule_by_hand():
  for guess, x, y in ARBENCH_EXAMPLE:
    assert gn.feedback("6850", guess) == (x, y), guess
  assert gn.feedback("1234", "1234") == (4, 0)  # all correct
  assert gn.feedback("1234", "5678") == (0, 0)  # zero overlap
  assert gn.feedback("1234", "4321") == (0, 4)  # all misplaced
  assert gn.feedback("1234", "1111") == (1, 0)  # repeated: 1 counted once
  assert gn.feedback("1234", "2211") == (1, 1)  # 2 in place, one 1 elsewhere
  assert gn.feedback("0521", "1250") == (0, 4)  # leading zero
  with pytest.raises(ValueError, match="differ in length"):
    gn.feedback("1234", "123")


def test_feedback_wording_and_extraction():
  assert gn.feedback_text(1, 2, "arbench") == (
      "1 digits are present in the answer and in the correct positions, "
      "2 digits are present in the answer but in the different positions."
  )
  assert gn.feedback_text(1, 2, "compact") == "1 right place, 2 wrong place."
  assert gn.extract_guess("I think 5678. Guess: [1234]", 4) == "1234"
  assert gn.extract_guess("maybe 1111 or 2222", 4) == "2222"
  assert gn.extract_guess("12345 is too long", 4) is None
  assert gn.extract_final("Guess: 1234\nFinal answer: 0987", 4) == "0987"
  assert gn.extract_final("Guess: 1234", 4) is None


def test_environment_episode():
  env = gn.GuessNumberEnv("1234", max_turns=3, style="compact")
  assert env.reset() is None
  r = env.step("Guess: 5678")
  assert (r.text, r.done) == ("0 right place, 0 wrong place.", False)
  r = env.step("no idea")  # no guess: a format reminder, and the turn is used
  assert r.text == gn.ASK_FORMAT and not r.done
  r = env.step("Guess: 1243")
  assert r.text.startswith("2 right place, 2 wrong place. No guesses left")
  assert not r.done and env.awaiting_final
  r = env.step("Final answer: 1234")
  assert r.done and env.verdict() == base.Verdict(1.0, True, "1234")
  with pytest.raises(RuntimeError, match="after the episode ended"):
    env.step("Guess: 1234")
  env.reset()
  r = env.step("Guess: 1234")  # a correct guess solves it at once
  assert r.done and r.text.endswith("Solved.") and env.verdict().correct
  env = gn.GuessNumberEnv("1234", max_turns=25, style="arbench")
  r = env.step("Final answer: 4321")
  assert r.done and not env.verdict().correct
  assert "not the number" in env.verdict().reason


def _replay_demonstration(task, ex):
  """Checks that the scripted episode replays in a fresh environment and
  wins; returns its messages."""
  messages = task.demonstration_messages(ex)
  assert messages[0] == base.message("user", ex.prompt)
  env = task.make_environment(ex)
  for team, reply in zip(messages[1::2], messages[2::2]):
    assert team["role"] == "assistant" and reply["role"] == "user"
    assert env.step(team["content"]).text == reply["content"]
  assert env.done and env.verdict().correct
  return messages


@pytest.fixture(scope="module")
def gn_task(tmp_path_factory):
  return gn.GuessNumberTask(
      train_size=40, test_size=20, data_dir=tmp_path_factory.mktemp("gn")
  )


def test_guess_number_splits_and_demonstrations(gn_task):
  train, test = gn_task.load("train"), gn_task.load("test")
  assert (len(train), len(test)) == (40, 20)
  for split, examples in (("train", train), ("test", test)):
    for ex in examples:
      assert datasets.hash_split(ex.target, 0.2) == split
      assert len(set(ex.target)) == 4 and ex.target.isdigit()
  assert not {e.target for e in train} & {e.target for e in test}
  for ex in test:
    messages = _replay_demonstration(gn_task, ex)
    assert (len(messages) - 1) // 2 <= gn_task.max_turns
    demo = gn_task.demonstration(ex)
    assert base.score_text(gn_task, ex, demo).correct
  wrong = base.score_text(gn_task, test[0], "Final answer: 0000")
  assert not wrong.correct


def test_guess_number_bad_arguments(tmp_path):
  with pytest.raises(ValueError, match="num_digits"):
    gn.GuessNumberTask(num_digits=7)
  with pytest.raises(ValueError, match="feedback_style"):
    gn.GuessNumberTask(feedback_style="verbose")
  small = gn.GuessNumberTask(num_digits=2, test_size=50, data_dir=tmp_path)
  with pytest.raises(Exception, match="targets exist"):
    small.load("test")  # 90 two-digit targets, ~18 in test


def test_arbench_gn_file_errors(tmp_path):
  path = tmp_path / "test.json"
  path.write_text('["8362", "0521"')
  with pytest.raises(DataFileError, match="test.json:1: malformed JSON"):
    gn.ArBenchGNTask(path).load()
  path.write_text("[]")
  with pytest.raises(DataFileError, match="empty file"):
    gn.ArBenchGNTask(path).load()
  path.write_text('["8362", "1123"]')
  with pytest.raises(DataFileError, match="item 1: expected a string of 4"):
    gn.ArBenchGNTask(path).load()
  with pytest.raises(DataFileError, match="no such file"):
    gn.ArBenchGNTask(tmp_path / "missing")
  path.write_text('["8362"]')
  (ex,) = gn.ArBenchGNTask(path).load()
  assert ex.target == "8362" and "25 guesses" in ex.prompt


@pytest.mark.benchdata
def test_arbench_gn_targets(shared_benchmarks):
  task = registry.get_task("arbench_gn", path=shared_benchmarks / "arbench")
  examples = task.load("test")
  raw = json.loads(
      (shared_benchmarks / "arbench/data/gn/test.json").read_text()
  )
  assert [e.target for e in examples] == raw and len(raw) == 100
  env = task.make_environment(examples[0])  # "8362"
  assert env.step("Guess: 8326").text == gn.feedback_text(2, 2, "arbench")


TABLE = {
    "cup": {"color": "red", "weight": 3, "shape": "round"},
    "key": {"color": "blue", "weight": 5, "shape": "flat"},
    "ball": {"color": "red", "weight": 7, "shape": "round"},
}


def test_oracle_answers_by_hand():
  env = tq.TwentyQuestionsEnv(TABLE, "ball", max_turns=20)
  asks = {
      "Is it red?": "Yes.",
      "Is it round?": "Yes.",
      "Is it blue?": "No.",
      "Is it green?": "No.",  # a colour no item has: exactly No
      "Is its weight > 5?": "Yes.",
      "Is its weight >= 7?": "Yes.",
      "Is its weight < 7?": "No.",
      "Is its weight = 7?": "Yes.",
      "Is it a cup?": "No.",
      "Is it ball?": "Yes.",
      "Is it made of wood?": tq.FORMS,  # material is not in this table
      "Is its size > 2?": tq.FORMS,
      "Tell me everything": tq.FORMS,
      "Is it red? Hmm, rather: is it flat?": "No.",  # the last question
  }
  for question, reply in asks.items():
    assert env.step(question).text == reply, question


def test_twenty_questions_episode():
  env = tq.TwentyQuestionsEnv(TABLE, "key", max_turns=2)
  assert env.step("Is it red?").text == "No."
  r = env.step("Is its weight > 4?")
  assert r.text.startswith("Yes. No questions left") and not r.done
  r = env.step("I think it is the key. Final answer: key")
  assert r.done and env.verdict().correct
  with pytest.raises(RuntimeError, match="after the episode ended"):
    env.step("Is it red?")
  env.reset()
  assert env.step("Final answer: cup").done and not env.verdict().correct


@pytest.fixture(scope="module")
def tq_task(tmp_path_factory):
  return tq.TwentyQuestionsTask(
      train_size=40, test_size=30, data_dir=tmp_path_factory.mktemp("tq")
  )


def test_twenty_questions_splits_and_demonstrations(tq_task):
  train, test = tq_task.load("train"), tq_task.load("test")
  assert (len(train), len(test)) == (40, 30)
  keys = set()
  for split, examples in (("train", train), ("test", test)):
    for ex in examples:
      key = json.dumps([sorted(ex.target["table"]), ex.target["hidden"]])
      assert datasets.hash_split(key, 0.2) == split
      keys.add(key)
      rows = [tuple(r[1:]) for r in ex.target["table"]]
      assert len(set(rows)) == len(rows) == 6  # every item identifiable
  assert len(keys) == 70
  for ex in test:
    _replay_demonstration(tq_task, ex)
    assert base.score_text(tq_task, ex, tq_task.demonstration(ex)).correct


def test_twenty_questions_bad_arguments():
  with pytest.raises(ValueError, match="num_items"):
    tq.TwentyQuestionsTask(num_items=1)
  with pytest.raises(ValueError, match="distinct rows"):
    tq.TwentyQuestionsTask(num_items=8, num_attributes=1)
  with pytest.raises(ValueError, match="not in the table"):
    tq.TwentyQuestionsEnv(TABLE, "lamp", max_turns=3)


def test_guess_number_argument_errors_name_the_value():
  with pytest.raises(ValueError, match="feedback_style .*got 'verbose'"):
    gn.GuessNumberTask(feedback_style="verbose")
  with pytest.raises(ValueError, match="feedback_style .*got 'verbose'"):
    gn.ArBenchGNTask("unused", feedback_style="verbose")
  # A float count used to pass the range check and fail later in
  # random.sample with a bare TypeError.
  with pytest.raises(ValueError, match="num_digits must be an int .*got 4.0"):
    gn.GuessNumberTask(num_digits=4.0)
  with pytest.raises(ValueError, match="max_turns must be an int .*got '5'"):
    gn.GuessNumberTask(max_turns="5")


def test_twenty_questions_argument_errors_name_the_value():
  with pytest.raises(ValueError, match="num_items must be an int .*got '6'"):
    tq.TwentyQuestionsTask(num_items="6")
  with pytest.raises(ValueError, match="num_attributes .*got 2.0"):
    tq.TwentyQuestionsTask(num_attributes=2.0)
  with pytest.raises(ValueError, match="max_turns must be an int .*got 0"):
    tq.TwentyQuestionsTask(max_turns=0)


def test_bracketed_final_answer_is_read():
  # The prompt and the env's own hint show "Final answer: [item]".
  assert tq.TwentyQuestionsEnv.final_hint == "Final answer: [item]"
  assert tq.extract_final("Final answer: [cup]") == "cup"
  assert tq.extract_final("Final answer: [ the Cup ]") == "cup"
  assert tq.extract_final("Final answer: a cup") == "cup"
  env = tq.TwentyQuestionsEnv(TABLE, "cup", max_turns=2)
  r = env.step("Final answer: [cup]")
  assert (r.text, r.done) == ("Correct.", True)
  assert env.verdict() == base.Verdict(1.0, True, "cup")
  env = tq.TwentyQuestionsEnv(TABLE, "cup", max_turns=1)
  assert env.step("Is it red?").text.startswith("Yes. No questions left")
  assert env.step("Final answer: [key]").text == "Wrong."
  assert env.verdict() == base.Verdict(0.0, False, "key", "wrong item")
  task = tq.TwentyQuestionsTask(train_size=1, test_size=1, data_dir="unused")
  ex = base.Example("u", "", {"table": [], "hidden": "cup"}, {})
  assert base.score_text(task, ex, "Final answer: [cup]") == base.Verdict(
      1.0, True, "cup"
  )


def test_decimal_thresholds_are_compared_exactly():
  assert tq.last_question("Is its weight < 3.5?") == ("num", "weight", "<", 3.5)
  assert tq.last_question("Is its weight > 3?") == ("num", "weight", ">", 3)
  # The hidden cup weighs 3: a threshold between integers must not be read
  # as its integer part.
  asks = {
      "Is its weight < 3.5?": "Yes.",
      "Is its weight > 3.5?": "No.",
      "Is its weight = 3.5?": "No.",
      "Is its weight >= 3.5?": "No.",
      "Is its weight <= 3.5?": "Yes.",
      "Is its weight > 2.5?": "Yes.",
      "Is its weight < 2.5?": "No.",
      "Is its weight <= 2.5?": "No.",
      "Is its weight = 3.0?": "Yes.",
      "Is its weight > 3?": "No.",
      "Is its weight >= 3?": "Yes.",
  }
  for question, reply in asks.items():
    env = tq.TwentyQuestionsEnv(TABLE, "cup", max_turns=20)
    assert env.step(question).text == reply, question
