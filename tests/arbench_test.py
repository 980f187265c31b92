"""Tests of AR-Bench DC and SP: loaders, environments, F1, responders."""

import copy
import json

import jax
import pytest

from sat_jax import models
from sat_jax import testing
from sat_jax.io_utils import DataFileError
from sat_jax.tasks import arbench_dc
from sat_jax.tasks import arbench_sp
from sat_jax.tasks import base
from sat_jax.tasks import registry
from sat_jax.tasks import responder as responder_lib


def _suspect(name, story, murderer=False):
  task = "Hide it." if murderer else "Help."
  return {
      "name": name, "introduction": f"{name} intro.", "story": story,
      "task": task, "is_murderer": murderer,
  }  # fmt: skip


CASE = {
    "time": "Night", "location": "Library", "index": 7,
    "victim": {"name": "Vic", "introduction": "A historian.",
               "cause_of_death": "A blow", "murder_weapon": "A statue"},
    "suspects": [_suspect("Ann Lee", "I was in the garden."),
                 _suspect("Bob Stone", "I held the statue.", murderer=True),
                 _suspect("Cy Young", "I slept.")],
    "label": 0,
    "key_question": ["Did Bob Stone have the weapon?"],
}  # fmt: skip
CASE["initial_information"] = {
    "time": "Night", "location": "Library", "victim": CASE["victim"],
    "suspect": [{"name": n, "introduction": f"{n} intro."}
                for n in ("Bob Stone", "Ann Lee", "Cy Young")],
}  # fmt: skip
PUZZLE = {
    "surface": "A man smiles at a gun.",
    "bottom": "He had hiccups and the scare cured them.",
    "index": 3,
}


def _write(tmp_path, name, data):
  path = tmp_path / name / "test.json"
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(data if isinstance(data, str) else json.dumps(data))
  return path


def test_f1_by_hand():
  assert arbench_sp.f1(list("abc"), list("abde")) == pytest.approx(4 / 7)
  assert arbench_sp.char_f1("abc", "abd") == pytest.approx(2 / 3)
  assert arbench_sp.char_f1("aab", "ab") == pytest.approx(0.8)  # multiplicity
  assert arbench_sp.word_f1("the cat sat", "the cat") == pytest.approx(0.8)
  assert arbench_sp.word_f1("Cat.", "cat") == 0.0  # raw split, as AR-Bench
  assert arbench_sp.word_f1("", "x") == 0.0


def test_letters_and_routing():
  assert arbench_dc.extract_letter("Reason: ... Final answer: C", 5) == "C"
  assert arbench_dc.extract_letter("Answer: B", 5) is None
  assert arbench_dc.extract_letter("Answer: [B]", 5, lenient=True) == "B"
  assert arbench_dc.extract_letter("Final answer: E", 3) is None  # no suspect E
  names = ["Bob Stone", "Ann Lee", "Cy Young"]
  assert arbench_dc.route("Question for Ann Lee: where?", names) == (
      "Ann Lee",
      "where?",
  )
  assert arbench_dc.route("question to stone: why?", names) == (
      "Bob Stone",
      "why?",
  )
  assert arbench_dc.route("Ask Cy Young where he was", names) == (
      "Cy Young", "Ask Cy Young where he was",
  )  # fmt: skip
  assert arbench_dc.route("Question for Dan: hi?", names) is None
  assert arbench_dc.route("Ann Lee or Cy Young?", names) is None


def test_detective_episode_routes_to_the_right_suspect(tmp_path):
  fake = responder_lib.ScriptedResponder(
      lambda facts, q: facts.split("Your story: ")[1]
  )
  task = arbench_dc.DetectiveCasesTask(
      _write(tmp_path, "dc", [CASE]), responder=fake, max_turns=3
  )
  (ex,) = task.load()
  assert ex.uid == "arbench-dc-0" and ex.meta["index"] == 7
  assert ex.target["letter"] == "A"
  assert "A. Bob Stone: Bob Stone intro." in ex.prompt
  assert "I held the statue" not in ex.prompt  # hidden facts stay hidden
  env = task.make_environment(ex)
  assert env.step("Question for Bob Stone: what did you hold?").text == (
      "Bob Stone: I held the statue."
  )
  assert env.step("Question for Ann Lee: where were you?").text == (
      "Ann Lee: I was in the garden."
  )
  r = env.step("Question for Bob Stone: and then?")
  assert r.text.endswith("No questions left. Reply with: Final answer: [A-C]")
  facts, question, history = fake.calls[-1]
  assert "You are Bob Stone" in facts and question == "and then?"
  assert history == (("what did you hold?", "I held the statue."),)
  r = env.step("Reason: he held it.\nAnswer: A")  # AR-Bench's own format
  assert r.done and env.verdict() == base.Verdict(1.0, True, "A")
  with pytest.raises(RuntimeError, match="after the episode ended"):
    env.step("Final answer: A")
  env.reset()
  assert env.step("nobody in particular").text.startswith("Ask one suspect")
  assert env.step("Final answer: B").done and not env.verdict().correct
  assert base.score_text(task, ex, "Final answer: a").correct
  # Markdown emphasis is read through, in the episode and in a text.
  env.reset()
  assert env.step("**Final answer:** **A**").done and env.verdict().correct
  assert base.score_text(task, ex, "Final answer: **A**").correct
  assert base.score_text(task, ex, "**Answer**: (A)").correct


def test_detective_bad_files(tmp_path):
  with pytest.raises(
      DataFileError, match=r"item 0: missing field\(s\) \['label'\]"
  ):
    bad = {k: v for k, v in CASE.items() if k != "label"}
    arbench_dc.DetectiveCasesTask(_write(tmp_path, "a", [bad])).load()
  wrong = copy.deepcopy(CASE)
  wrong["label"] = 3
  with pytest.raises(DataFileError, match="label 3 is not a suspect index"):
    arbench_dc.DetectiveCasesTask(_write(tmp_path, "b", [wrong])).load()
  stranger = copy.deepcopy(CASE)
  stranger["initial_information"]["suspect"][2]["name"] = "Dan"
  with pytest.raises(DataFileError, match="'Dan' has no hidden facts"):
    arbench_dc.DetectiveCasesTask(_write(tmp_path, "c", [stranger])).load()
  with pytest.raises(DataFileError, match="empty file"):
    arbench_dc.DetectiveCasesTask(_write(tmp_path, "d", "[]")).load()
  with pytest.raises(DataFileError, match="malformed JSON"):
    arbench_dc.DetectiveCasesTask(_write(tmp_path, "e", "[{")).load()
  task = arbench_dc.DetectiveCasesTask(_write(tmp_path, "f", [CASE]))
  with pytest.raises(ValueError, match="needs a responder"):
    task.make_environment(task.load()[0])


def test_puzzle_episode_and_f1_verdict(tmp_path):
  replies = iter(["Yes, he did.", "irrelevant", "Maybe so"])
  fake = responder_lib.ScriptedResponder(lambda facts, q: next(replies))
  task = arbench_sp.SituationPuzzlesTask(
      _write(tmp_path, "sp", [PUZZLE]), responder=fake, max_turns=3
  )
  (ex,) = task.load()
  assert PUZZLE["surface"] in ex.prompt and PUZZLE["bottom"] not in ex.prompt
  assert ex.uid == "arbench-sp-0" and ex.meta["index"] == 3
  env = task.make_environment(ex)
  assert env.step("Q: Did he have hiccups?").text == "Yes"
  assert env.step("Let me think. Q: Was he hungry?").text == "Unknown"
  assert env.step("Q: Was it a joke?").text.startswith("Maybe so No questions")
  facts, question, _ = fake.calls[0]
  assert PUZZLE["bottom"] in facts and question == "Did he have hiccups?"
  r = env.step("He had hiccups and the scare cured them.")  # last reply
  v = env.verdict()
  assert (
      r.done and v.correct and v.reward == 1.0 and "char F1 1.000" in v.reason
  )
  half = base.score_text(task, ex, "Final answer: He had the hiccups.")
  # Shared words "He", "had", "the" ("hiccups." keeps its dot): P = 3/4,
  # R = 3/8, F1 = 0.5: just correct at the default threshold 0.5.
  assert half.reward == pytest.approx(0.5) and half.correct
  low = base.score_text(task, ex, "Final answer: He smiled.")
  assert low.reward == pytest.approx(2 * (1 / 2) * (1 / 8) / (5 / 8))
  assert not low.correct
  with pytest.raises(
      DataFileError, match=r"item 0: missing field\(s\) \['bottom'\]"
  ):
    arbench_sp.SituationPuzzlesTask(
        _write(tmp_path, "x", [{"surface": "s"}])
    ).load()


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
  config = testing.tiny_config("qwen3")
  params = models.init_params(config, jax.random.key(0))
  tokenizer = models.load_tokenizer(
      testing.build_tiny_tokenizer(tmp_path_factory.mktemp("tok"))
  )
  return config, params, tokenizer


def test_lm_responder_in_the_detective_environment(tmp_path, tiny_lm):
  def make():
    return responder_lib.LMResponder(
        *tiny_lm, max_new_tokens=8, temperature=0.0
    )

  lm = make()
  ids = lm.prompt_ids("You are Ann.", "where were you?", [("hi?", "hello")])
  text = tiny_lm[2].decode(ids)
  assert text.index("You are Ann.") < text.index("hi?") < text.index("hello")
  assert text.index("hello") < text.index("where were you?")
  task = arbench_dc.DetectiveCasesTask(
      _write(tmp_path, "dc", [CASE]), responder=lm
  )
  (ex,) = task.load()
  env = task.make_environment(ex)
  reply = env.step("Question for Cy Young: did you sleep?").text
  # Greedy decoding: the same model answering Cy Young's own facts.
  cy = next(
      s["facts"] for s in ex.target["suspects"] if s["name"] == "Cy Young"
  )
  assert reply == "Cy Young: " + make().reply(cy, "did you sleep?")
  assert env.history["Cy Young"] == [
      ("did you sleep?", reply[len("Cy Young: ") :])
  ]


def test_lm_responder_cuts_old_exchanges_not_the_facts(tiny_lm):
  lm = responder_lib.LMResponder(*tiny_lm, max_new_tokens=8, temperature=0.0)
  facts, question = "SECRET: the butler did it.", "did the butler do it?"
  history = [(f"question {i}?", "No.") for i in range(6)]

  def rendered(kept):
    messages = [{"role": "system", "content": facts}]
    for q, a in kept:
      messages += [
          {"role": "user", "content": q},
          {"role": "assistant", "content": a},
      ]
    messages.append({"role": "user", "content": question})
    return models.render_chat(tiny_lm[2], messages)

  # Room for the facts, the question and the last two exchanges only (one
  # token short of three): the four oldest go, the system turn stays.
  lm.max_prompt_tokens = len(rendered(history[3:])) - 1
  ids = lm.prompt_ids(facts, question, history)
  assert ids == rendered(history[4:])
  assert tiny_lm[2].decode(ids).count(facts) == 1
  lm.max_prompt_tokens = len(rendered([]))
  assert lm.prompt_ids(facts, question, history) == rendered([])
  lm.max_prompt_tokens = len(rendered([])) - 1
  with pytest.raises(ValueError, match="facts .* and question .* alone"):
    lm.prompt_ids(facts, question, history)


def test_make_responder_and_registry(tmp_path):
  fake = responder_lib.ScriptedResponder(lambda f, q: "No")
  assert responder_lib.make_responder(fake) is fake
  with pytest.raises(TypeError, match="Responder or a path"):
    responder_lib.make_responder(3)
  task = registry.get_task("arbench_sp", path=_write(tmp_path, "sp", [PUZZLE]))
  assert isinstance(task, arbench_sp.SituationPuzzlesTask)


@pytest.mark.benchdata
def test_real_detective_cases_letters(shared_benchmarks):
  task = arbench_dc.DetectiveCasesTask(shared_benchmarks / "arbench")
  examples = task.load()
  raw = json.loads(
      (shared_benchmarks / "arbench/data/dc/test.json").read_text()
  )
  assert len(examples) == len(raw) == 100
  for ex, item in zip(examples, raw):
    # The letter names the suspect whose hidden record says is_murderer.
    (murderer,) = [s["name"] for s in item["suspects"] if s.get("is_murderer")]
    letter = ex.target["letter"]
    assert f"\n{letter}. {murderer}:" in ex.prompt
    assert base.score_text(task, ex, f"Final answer: {letter}").correct


@pytest.mark.benchdata
def test_real_situation_puzzles(shared_benchmarks):
  task = arbench_sp.SituationPuzzlesTask(shared_benchmarks / "arbench")
  examples = task.load()
  assert len(examples) == 100
  # The file's `index` repeats (98 twice); the uids do not.
  assert len({ex.uid for ex in examples}) == 100
  for ex in examples:
    own = base.score_text(task, ex, "Final answer: " + ex.target["bottom"])
    assert own.correct and own.reward == 1.0
