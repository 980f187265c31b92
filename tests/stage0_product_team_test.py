"""A ProductAgent slot in team generation: its ends are the two models."""

import functools

import jax
import pytest
import transformers

from sat_jax import models
from sat_jax import testing
from sat_jax.stage0 import product
from sat_jax.tasks import base
from sat_jax.team import generate
from sat_jax.team import lm_agent
from sat_jax.team import protocols
from sat_jax.team import rollout

PROTOCOL = protocols.ProtocolConfig(
    max_new_tokens=8, prompt_buckets=(504,), view_buckets=(128,), min_rows=4
)
CUR = testing.tiny_config("qwen3")
PRE = testing.tiny_config("qwen3", num_layers=1, hidden_size=48, mlp_dim=96)


class EchoTask(base.Task):
  name = "echo"

  def load(self, split):
    return [base.Example(f"e{i}", f"Say {i}.", "") for i in range(2)]

  def extract_answer(self, text):
    return text or None

  def check(self, example, answer):
    return base.Verdict(float(bool(answer)), bool(answer), answer)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  return transformers.AutoTokenizer.from_pretrained(
      str(testing.build_tiny_tokenizer(tmp_path_factory.mktemp("tok")))
  )


@functools.lru_cache(maxsize=None)
def _params(config, seed):
  params = jax.jit(models.init_params, static_argnums=0)(
      config, jax.random.key(seed)
  )
  return jax.tree.map(lambda x: x * 4 if x.ndim >= 2 else x, params)


def _texts(agents, params, tok):
  task = EchoTask()
  gen = generate.make_generate_fn(agents, [tok] * 2, task, PROTOCOL, params)
  samples = gen(task.load("test"), 2, jax.random.key(4))
  return [[s.agent_texts for s in per_example] for per_example in samples]


def test_the_ends_of_the_ball_play_like_one_model(tok):
  first = lm_agent.LMAgent(CUR, 0.8)
  pre, cur = _params(PRE, 2), _params(CUR, 1)
  plain = {
      name: _texts(
          [first, lm_agent.LMAgent(config, 0.8)], [_params(CUR, 0), p], tok
      )
      for name, config, p in (("cur", CUR, cur), ("pre", PRE, pre))
  }
  # The second agent speaks, and the two models say different things.
  assert any(texts[1] for per in plain["cur"] for texts in per)
  assert plain["cur"] != plain["pre"]
  for delta0, end in ((0.0, "cur"), (1e6, "pre")):
    slot = product.ProductAgent(CUR, 0.8, pre_config=PRE, delta0=delta0)
    got = _texts([first, slot], [_params(CUR, 0), (pre, cur)], tok)
    assert got == plain[end], delta0


def test_a_product_slot_is_for_evaluation_only(tok):
  slot = product.ProductAgent(CUR, 0.8, pre_config=PRE, delta0=0.1)
  with pytest.raises(ValueError, match="evaluation only"):
    rollout.make_rollout_fn(
        [lm_agent.LMAgent(CUR, 0.8), slot],
        [tok] * 2,
        EchoTask(),
        EchoTask().load("train"),
        PROTOCOL,
        num_prompts=1,
        group_size=2,
    )
  with pytest.raises(TypeError, match="decoding time only"):
    slot.token_logprobs(None, None)
  with pytest.raises(ValueError, match="equal vocabularies"):
    product.ProductAgent(
        CUR, 0.8, pre_config=testing.tiny_config("qwen3", vocab_size=640)
    )
