"""End-to-end test of `sat-jax sample`: its JSON agrees with the model."""

import json

from absl import flags
from absl.testing import flagsaver
import jax
import numpy as np

from sat_jax import models
from sat_jax import testing
from sat_jax.commands import sample

_forward = jax.jit(models.forward, static_argnums=0)


def _run(**flag_values):
  flags.FLAGS.unparse_flags()
  flags.FLAGS(["sat-jax sample"])
  with flagsaver.flagsaver(**flag_values):
    sample.main(["sat-jax sample"])


def test_default_demo_writes_samples_consistent_with_the_model(tmp_path):
  _run(workdir=str(tmp_path), max_new_tokens=12, seed=3)
  out = json.loads((tmp_path / "samples.json").read_text())
  assert out["model"] == "qwen3-tiny" and len(out["samples"]) == 2
  assert out["timing"]["new_tokens"] == sum(
      len(s["completion_ids"]) for s in out["samples"]
  )
  assert out["timing"]["new_tokens_per_s"] > 0

  # The same random model and tokenizer, rebuilt independently.
  config = testing.tiny_config("qwen3")
  params = jax.jit(models.init_params, static_argnums=0)(
      config, jax.random.key(3)
  )
  tok = models.load_tokenizer(testing.build_tiny_tokenizer(tmp_path / "tok"))
  stops = set(out["options"]["stop_token_ids"])
  assert stops == {tok.convert_tokens_to_ids(testing.IM_END)}
  rows = [s["prompt_ids"] + s["completion_ids"] for s in out["samples"]]
  width = max(len(r) for r in rows)
  ids = np.zeros((len(rows), width), np.int32)
  mask = np.zeros((len(rows), width), np.int32)
  for i, r in enumerate(rows):  # right padded
    ids[i, : len(r)], mask[i, : len(r)] = r, 1
  logp = np.asarray(jax.nn.log_softmax(_forward(config, params, ids, mask), -1))
  for i, (s, question) in enumerate(
      zip(out["samples"], sample._PROMPTS.default)
  ):
    assert s["prompt_ids"] == models.render_chat(
        tok, [{"role": "user", "content": question}]
    )
    completion = s["completion_ids"]
    assert 1 <= len(completion) <= 12
    assert all(t not in stops for t in completion[:-1])
    assert s["text"] == tok.decode(completion)
    # Teacher-forced log-probs of the completion under the model.
    p = len(s["prompt_ids"])
    ref = logp[i, np.arange(p - 1, p - 1 + len(completion)), completion]
    np.testing.assert_allclose(s["logprobs"], ref, atol=1e-5)


def test_model_dir_and_bench_mode(tmp_path):
  model_dir = testing.save_tiny_hf_model(tmp_path / "m", "llama", seed=2)
  testing.build_tiny_tokenizer(model_dir)
  _run(
      workdir=str(tmp_path / "out"),
      model_dir=str(model_dir),
      bench_prompt_len=10,
      batch_size=3,
      max_new_tokens=5,
      temperature=0.0,
      repeats=2,
  )
  out = json.loads((tmp_path / "out" / "samples.json").read_text())
  assert out["model"] == str(model_dir)
  assert out["options"]["stop_token_ids"] == []
  assert len(out["timing"]["runs_s"]) == 2
  config, params = models.load_hf(model_dir)
  ids = np.asarray(
      [s["prompt_ids"] + s["completion_ids"] for s in out["samples"]], np.int32
  )
  assert ids.shape == (3, 15)
  # Greedy: each token is the argmax of the full forward.
  logits = _forward(config, params, ids, np.ones_like(ids))[:, 9:-1]
  np.testing.assert_array_equal(np.argmax(logits, -1), ids[:, 10:])
