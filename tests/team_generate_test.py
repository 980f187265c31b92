"""Team generation behind `sat-jax eval`: samples, scoring, multi-turn verdicts."""

import dataclasses
import json

import jax
import numpy as np
import pytest
import transformers

from sat_jax import models
from sat_jax import testing
from sat_jax.eval import runner
from sat_jax.tasks import base
from sat_jax.tasks import guess_number
from sat_jax.team import generate
from sat_jax.team import lm_agent
from sat_jax.team import protocols

PROTOCOL = protocols.ProtocolConfig(
    max_new_tokens=8, prompt_buckets=(504,), view_buckets=(128,), min_rows=4
)
AGENTS = [lm_agent.LMAgent(testing.tiny_config("qwen3"), 0.8) for _ in range(2)]


class VowelTask(base.Task):
  """Correct iff the message has more vowels than digits (a coin flip)."""

  name = "vowels"

  def load(self, split):
    return [base.Example(f"v{i}", f"Say {i}.", "") for i in range(2)]

  def extract_answer(self, text):
    return text or None

  def check(self, example, answer):
    ok = sum(c in "aeiou" for c in answer) > sum(c.isdigit() for c in answer)
    return base.Verdict(float(ok), ok, answer)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  return transformers.AutoTokenizer.from_pretrained(
      str(testing.build_tiny_tokenizer(tmp_path_factory.mktemp("tok")))
  )


def _params():
  return [
      models.init_params(a.config, jax.random.key(k))
      for k, a in enumerate(AGENTS)
  ]


def test_k_team_samples_per_example_scored_by_the_runner(tok, tmp_path):
  task = VowelTask()
  gen = generate.make_generate_fn(AGENTS, [tok] * 2, task, PROTOCOL, _params())
  examples = task.load("test")
  summary = runner.evaluate(
      task, examples, gen, 2, jax.random.key(0), tmp_path, progress=False
  )
  records = gen.last.episodes
  assert [r.uid for r in records] == ["v0", "v0", "v1", "v1"]
  rows = [json.loads(l) for l in (tmp_path / "predictions.jsonl").open()]
  for row, rec in zip(rows, records):
    # relay: the team answer is the last message, here agent 1's.
    assert row["text"] == rec.messages[-1].text == rec.agent_texts[1]
    assert [t["speaker"] for t in row["transcript"]] == [
        "task",
        "agent0",
        "agent1",
    ]
    assert row["correct"] == task.check(None, rec.team_text).correct
    assert [a["correct"] for a in row["agents"]] == [
        bool(rec.agent_texts[j])
        and task.check(None, rec.agent_texts[j]).correct
        for j in range(2)
    ]
  correct = np.array([r["correct"] for r in rows]).reshape(2, 2)
  assert summary["avg@2"] == pytest.approx(correct.mean())
  assert summary["pass@2"] == pytest.approx(correct.any(axis=1).mean())


def test_multi_turn_samples_carry_the_environment_verdict(tok, tmp_path):
  task = guess_number.GuessNumberTask(
      num_digits=2, max_turns=1, train_size=2, test_size=2, data_dir=tmp_path
  )
  cfg = dataclasses.replace(PROTOCOL, rounds=2, router="round_robin")
  gen = generate.make_generate_fn(AGENTS, [tok] * 2, task, cfg, _params())
  examples = task.load("test")
  samples = gen(examples, 2, jax.random.key(1))
  assert [len(s) for s in samples] == [2, 2]
  for ex, per_example in zip(examples, samples):
    for sample in per_example:
      assert sample.verdict is not None
      assert sample.verdict.correct == (sample.verdict.answer == ex.target)
      speakers = [t["speaker"] for t in sample.transcript]
      assert speakers[0] == "task" and "environment" in speakers


def test_sampling_overrides_are_applied_and_checked(tok):
  task = VowelTask()
  gen = generate.make_generate_fn(
      AGENTS, [tok] * 2, task, PROTOCOL, _params(), top_k=5, top_p=0.9
  )
  for opt in gen.speaker.options:
    assert (opt.temperature, opt.top_k, opt.top_p) == (0.8, 5, 0.9)
  with pytest.raises(ValueError, match="3 parameter sets for 2 agents"):
    generate.make_generate_fn(
        AGENTS, [tok] * 2, task, PROTOCOL, _params() + _params()[:1]
    )
  with pytest.raises(ValueError, match="k must be an int >= 1"):
    generate.make_generate_fn(AGENTS, [tok] * 2, task, PROTOCOL, _params())(
        task.load("test"), 0, jax.random.key(0)
    )
