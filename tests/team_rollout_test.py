"""Batched LM team rollouts: consistency, tokenizers, fast path, bad input.

Every rollout here has E = 4 episodes (2 prompts x 2), 8-token messages and
one prompt bucket, so the tiny models' sampler compiles once per agent
architecture for the whole module.
"""

import dataclasses
import functools
import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers

from sat_jax import models
from sat_jax import sampling
from sat_jax import scoring
from sat_jax import sharding
from sat_jax import testing
from sat_jax.tasks import base
from sat_jax.tasks import guess_number
from sat_jax.team import lm_agent
from sat_jax.team import protocols
from sat_jax.team import rollout
from sat_jax.team import speaker as speaker_lib
from sat_jax.team import transcript

CFG = protocols.ProtocolConfig(
    max_new_tokens=8,
    rounds=2,
    prompt_buckets=(504,),  # = 512 - 8: one bucket, one compile
    view_buckets=(512,),
    min_rows=4,
)
QWEN = testing.tiny_config("qwen3")
SMALL_LLAMA = testing.tiny_config(
    "llama",
    vocab_size=300,
    hidden_size=32,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
    mlp_dim=64,
    num_layers=1,
)


class DigitTask(base.Task):
  """Graded toy reward: the fraction of digits in the message."""

  name = "digits"
  system_prompt = "Reply with digits."

  def load(self, split):
    return [base.Example(f"d{i}", f"Say {i}{i}.", str(i)) for i in range(4)]

  def extract_answer(self, text):
    return text or None

  def check(self, example, answer):
    frac = sum(c.isdigit() for c in answer) / len(answer)
    return base.Verdict(frac, frac > 0.2, answer)


@pytest.fixture(scope="module")
def toks(tmp_path_factory):
  root = tmp_path_factory.mktemp("toks")
  load = lambda p: transformers.AutoTokenizer.from_pretrained(str(p))
  return (
      load(testing.build_tiny_tokenizer(root / "a")),
      load(testing.build_tiny_tokenizer(root / "b", vocab_size=300)),
  )


@functools.cache
def _params(config, seed):
  return models.init_params(config, jax.random.key(seed))


@functools.partial(jax.jit, static_argnums=0)
def _logp(agent, params, inputs):
  return agent.token_logprobs(params, inputs)


@functools.partial(jax.jit, static_argnums=0)
def _kl(agent, params, inputs):
  return agent.state_kl(params, params, inputs)


TEMPERATURE = 0.8  # != 1, so a scorer ignoring tau would fail


def _team(n=3, config=QWEN):
  return [lm_agent.LMAgent(config, TEMPERATURE) for _ in range(n)]


def _rollout(agents, tokenizers, cfg=CFG, task=None, key=0, **kwargs):
  task = task or DigitTask()
  fn = rollout.make_rollout_fn(
      agents,
      tokenizers,
      task,
      task.load("train"),
      cfg,
      num_prompts=2,
      group_size=2,
      **kwargs,
  )
  params = [_params(a.config, k) for k, a in enumerate(agents)]
  return fn, fn(params, jax.random.key(key)), params


def _check_consistency(agents, params, batch):
  for k, (agent, view) in enumerate(zip(agents, batch.views)):
    own = np.asarray(view.mask_ExT)
    assert own.sum() > 0, f"agent {k} never acted"
    logp = np.asarray(_logp(agent, params[k], view.inputs))
    behaviour = np.asarray(view.behaviour_logp_ExT)
    assert np.abs(logp - behaviour)[own].max() <= 1e-5, k
    assert np.all(behaviour[own] < 0) and np.all(behaviour[~own] == 0)
    kl = np.asarray(_kl(agent, params[k], view.inputs))
    assert np.abs(kl[own]).max() <= 1e-6, k
    if "positions_ExA" in view.inputs:  # the head ran at own tokens only
      positions = np.asarray(view.inputs["positions_ExA"])
      for e, row in enumerate(positions):  # each row's own tokens, in order
        np.testing.assert_array_equal(row[row > 0], np.flatnonzero(own[e]))
      assert np.all(logp[~own] == 0), k


@pytest.mark.parametrize("protocol", protocols.PROTOCOLS)
def test_recomputed_logprobs_equal_behaviour_and_kl_is_zero(toks, protocol):
  agents = _team()
  cfg = dataclasses.replace(CFG, protocol=protocol)
  fn, batch, params = _rollout(agents, [toks[0]] * 3, cfg)
  _check_consistency(agents, params, batch)
  # Own tokens are a minority of each view: scored at their positions only,
  # as many slots as an agent can say (one update shape for every batch).
  for view in batch.views:
    assert view.inputs["positions_ExA"].shape == (
        4,
        cfg.rounds * cfg.max_new_tokens,
    )
  assert batch.num_groups == 2
  np.testing.assert_array_equal(batch.group_E, [0, 0, 1, 1])
  np.testing.assert_allclose(
      batch.reward_E, [r.reward for r in fn.last.episodes], rtol=1e-6
  )
  # Every agent spoke twice per episode: 2 messages of 1..8 own tokens.
  for view in batch.views:
    counts = np.asarray(view.mask_ExT).sum(axis=1)
    assert np.all((counts >= 2) & (counts <= 16))
  # A message ends with its stop token unless it was cut at 8 tokens.
  stop = toks[0].convert_tokens_to_ids("<|im_end|>")
  for e, record in enumerate(fn.last.episodes):
    stops = sum(
        int(
            np.sum(
                (np.asarray(v.inputs["tokens_ExT"][e]) == stop)
                & np.asarray(v.mask_ExT[e])
            )
        )
        for v in batch.views
    )
    assert stops + record.truncated == 6  # 3 agents x 2 rounds


def test_two_tokenizers_and_sizes_in_one_team(toks):
  agents = [
      lm_agent.LMAgent(QWEN, TEMPERATURE),
      lm_agent.LMAgent(SMALL_LLAMA, TEMPERATURE),
  ]
  fn, batch, params = _rollout(agents, list(toks))
  _check_consistency(agents, params, batch)
  for e, record in enumerate(fn.last.episodes):
    for k, tok in enumerate(toks):
      ids = np.asarray(batch.views[k].inputs["tokens_ExT"][e])
      n = int(np.asarray(batch.views[k].inputs["mask_ExT"][e]).sum())
      text = tok.decode(ids[:n].tolist(), skip_special_tokens=True)
      # Each agent's view holds the transcript up to its own last message,
      # in order: [task, A0 r0, A1 r0, A0 r1] for agent 0, all 5 for agent 1.
      pos = 0
      assert len(record.messages) == 5
      for m in record.messages[: 4 + k]:
        at = text.find(m.text, pos)
        assert at >= 0, (k, m, text)
        pos = at + len(m.text)
  assert np.asarray(batch.views[1].inputs["tokens_ExT"]).max() < 300


def test_same_tokenizer_fast_path_gives_identical_batches(toks):
  agents = _team()
  cfg = dataclasses.replace(CFG, protocol="vote")
  fast, a, _ = _rollout(agents, [toks[0]] * 3, cfg, share_renderings=True)
  slow, b, _ = _rollout(agents, [toks[0]] * 3, cfg, share_renderings=False)
  leaves_a, tree_a = jax.tree.flatten(a)
  leaves_b, tree_b = jax.tree.flatten(b)
  assert tree_a == tree_b
  for x, y in zip(leaves_a, leaves_b):
    np.testing.assert_array_equal(x, y)
  assert fast.last.episodes == slow.last.episodes
  renders = lambda fn: sum(
      len(r._renders) for r in {id(r): r for r in fn.speaker.renderers}.values()
  )
  assert renders(fast) < renders(slow)  # one shared rendering of round 0


def test_inactive_agents_have_no_positions(toks):
  agents = _team()
  cfg = dataclasses.replace(
      CFG, protocol="solo", router="round_robin", rounds=1
  )
  fn, batch, params = _rollout(agents, [toks[0]] * 3, cfg)
  for k, view in enumerate(batch.views):
    # One message of at most 8 tokens: 8 slots (a count rounded to 16 not).
    assert view.inputs["positions_ExA"].shape == (4, 8)
    acted = np.asarray(view.inputs["mask_ExT"]).any(axis=1)
    np.testing.assert_array_equal(acted, [e % 3 == k for e in range(4)])
    assert np.asarray(view.mask_ExT)[~acted].sum() == 0
  rewards = [r.agent_verdicts[r.episode % 3].reward for r in fn.last.episodes]
  np.testing.assert_allclose(batch.reward_E, rewards, rtol=1e-6)


def test_environment_replies_are_in_every_view(toks, tmp_path):
  task = guess_number.GuessNumberTask(
      num_digits=2, max_turns=2, train_size=4, test_size=2, data_dir=tmp_path
  )
  agents = _team(2)
  cfg = dataclasses.replace(CFG, rounds=3)
  fn, batch, params = _rollout(agents, [toks[0]] * 2, cfg, task=task)
  _check_consistency(agents, params, batch)
  for e, record in enumerate(fn.last.episodes):
    replies = [m.text for m in record.messages if m.speaker == transcript.ENV]
    assert len(replies) == record.rounds  # one reply per team turn
    assert record.multi_turn and record.verdict.reason  # unsolved: a reason
    for k in range(2):
      ids = np.asarray(batch.views[k].inputs["tokens_ExT"][e])
      text = toks[0].decode(ids.tolist(), skip_special_tokens=True)
      # Both speak after every reply but the last (the episode then ends).
      for reply in replies[: record.rounds - 1]:
        assert reply in text


def test_repeated_rollouts_do_not_recompile_the_sampler(toks):
  agents = _team()
  fn, first, params = _rollout(agents, [toks[0]] * 3)
  traces = sampling.num_traces()
  again = fn(params, jax.random.key(0))
  assert sampling.num_traces() == traces
  for x, y in zip(jax.tree.leaves(first), jax.tree.leaves(again)):
    np.testing.assert_array_equal(x, y)
  key = jax.random.key(0)
  with jax.transfer_guard("disallow"):
    fn(params, key)
  assert fn.last.stats["sampler_calls"] == 6  # 2 rounds x 3 agents


def test_sharded_rollout_equals_one_device(toks):
  agents = _team(2)
  fn, ref, params = _rollout(agents, [toks[0]] * 2)
  mesh = sharding.make_mesh(
      sharding.MeshConfig(axes=(("data", 2), ("fsdp", 2), ("tensor", 2)))
  )
  with jax.set_mesh(mesh):
    placed = [
        jax.device_put(
            p, sharding.logical_to_sharding(models.param_axes(QWEN), mesh)
        )
        for p in params
    ]
    out = fn(placed, jax.random.key(0))
  view = out.views[0]
  assert view.inputs["tokens_ExT"].sharding.spec[0] == ("data", "fsdp")
  for x, y in zip(jax.tree.leaves(ref), jax.tree.leaves(out)):
    if np.issubdtype(np.asarray(x).dtype, np.floating):
      np.testing.assert_allclose(x, y, atol=1e-5)
    else:
      np.testing.assert_array_equal(x, y)


def test_sampling_mesh_samples_there_and_batches_on_the_callers_mesh(toks):
  agents = _team(2)
  _, ref, params = _rollout(agents, [toks[0]] * 2)
  sampler_mesh = sharding.make_mesh(sharding.MeshConfig(num_devices=2))
  train_mesh = sharding.make_mesh(
      sharding.MeshConfig(num_devices=1), devices=jax.devices()[7:]
  )
  fn, _, _ = _rollout(agents, [toks[0]] * 2, sampling_mesh=sampler_mesh)
  on_train = [jax.device_put(p, jax.devices()[7]) for p in params]
  with jax.set_mesh(train_mesh):
    out = fn(on_train, jax.random.key(0))
  # The sampler ran on the sampler mesh, rows split over its two devices ...
  speaker = fn.speaker
  for p in speaker.params:
    assert (
        p["embed"].sharding.mesh.devices.tolist()
        == sampler_mesh.devices.tolist()
    )
  # ... and the batch lives on the training mesh, equal to the plain one.
  tokens = out.views[0].inputs["tokens_ExT"]
  assert tokens.sharding.device_set == {jax.devices()[7]}
  for x, y in zip(jax.tree.leaves(ref), jax.tree.leaves(out)):
    if np.issubdtype(np.asarray(x).dtype, np.floating):
      np.testing.assert_allclose(x, y, atol=1e-5)
    else:
      np.testing.assert_array_equal(x, y)


def test_mesh_num_devices_is_checked():
  with pytest.raises(ValueError, match="num_devices=0"):
    sharding.MeshConfig(num_devices=0)
  with pytest.raises(ValueError, match="num_devices=9 exceeds the 8"):
    sharding.make_mesh(sharding.MeshConfig(num_devices=9))
  mesh = sharding.make_mesh(sharding.MeshConfig(num_devices=2))
  assert mesh.devices.ravel().tolist() == jax.devices()[:2]
  # Devices of two processes (stand-ins: only process_index is read before
  # the refusal): the first n would leave a process out of the mesh.
  two_hosts = [types.SimpleNamespace(process_index=i // 4) for i in range(8)]
  with pytest.raises(ValueError, match="num_devices=2: .* single process"):
    sharding.make_mesh(sharding.MeshConfig(num_devices=2), two_hosts)


# --------------------------------------------------------------- bad input


def test_group_size_below_two_is_refused(toks):
  with pytest.raises(ValueError, match="group_size=1 must be an int >= 2"):
    rollout.make_rollout_fn(
        _team(1),
        [toks[0]],
        DigitTask(),
        DigitTask().load("train"),
        CFG,
        num_prompts=1,
        group_size=1,
    )


def test_a_tokenizer_without_chat_template_is_refused(toks):
  bare = transformers.PreTrainedTokenizerFast(
      tokenizer_object=toks[0].backend_tokenizer,
      eos_token="<|im_end|>",
      pad_token="<|pad|>",
  )
  with pytest.raises(
      transcript.TranscriptError, match="agent 1.*chat template"
  ):
    _rollout(_team(2), [toks[0], bare])


def test_a_prompt_longer_than_the_context_is_refused_before_sampling(toks):
  short = lm_agent.LMAgent(QWEN.replace(max_seq_len=30), TEMPERATURE)
  traces = sampling.num_traces()
  with pytest.raises(speaker_lib.ContextOverflowError, match="agent 1.*> max"):
    _rollout([_team(1)[0], short], [toks[0]] * 2)
  assert sampling.num_traces() == traces


def test_overflow_mid_episode_errors_or_stops(toks):
  # A first prompt of 500 tokens fits agent 0 (500 + 8 <= 512); agent 1's
  # first prompt adds agent 0's message and a turn header, and does not.
  (r,) = transcript.make_renderers(
      [toks[0]],
      None,
      system_prompt=DigitTask.system_prompt,
      agent_tag=CFG.agent_tag,
      env_tag="",
  )
  length = lambda n: len(
      r.encode(
          r.render([
              r.chat([transcript.Message(transcript.TASK, "Say" + " 7" * n)], 0)
          ])
      )[0]
  )
  n = next(n for n in range(400, 520) if length(n) == 500)

  class LongTask(DigitTask):

    def load(self, split):
      return [base.Example(f"l{i}", "Say" + " 7" * n, "7") for i in range(2)]

  agents = _team(2)
  stop = dataclasses.replace(CFG, overflow="stop")
  fn, batch, params = _rollout(agents, [toks[0]] * 2, stop, task=LongTask())
  assert all(r.overflow and r.team_speaker == 0 for r in fn.last.episodes)
  assert fn.last.stats["overflow_rate"] == 1.0
  assert not np.asarray(batch.views[1].inputs["mask_ExT"]).any()
  _check_consistency(agents[:1], params[:1], batch)
  error = dataclasses.replace(stop, overflow="error")
  with pytest.raises(
      speaker_lib.ContextOverflowError, match="agent 1: episode 0 .* > max"
  ):
    _rollout(agents, [toks[0]] * 2, error, task=LongTask())


def test_training_rollouts_sample_the_scored_distribution(toks):
  agent = lm_agent.LMAgent(QWEN, temperature=0.7)
  (r,) = transcript.make_renderers(
      [toks[0]], None, system_prompt=None, agent_tag="", env_tag=""
  )
  options = speaker_lib.training_options(agent, r, CFG)
  assert (options.temperature, options.top_k, options.top_p) == (0.7, 0, 1.0)
  for change in (dict(top_p=0.9), dict(top_k=5), dict(temperature=1.0)):
    bad = dataclasses.replace(options, **change)
    with pytest.raises(ValueError, match=re.escape(next(iter(change)))):
      speaker_lib.LMSpeaker([agent], [r], [bad], CFG, training=True)


def test_agent_kl_and_fused_pass_match_the_scoring_kernels():
  agent = lm_agent.LMAgent(QWEN, TEMPERATURE)
  p_new, p_old = _params(QWEN, 1), _params(QWEN, 2)
  tokens = jax.random.randint(jax.random.key(3), (2, 12), 0, QWEN.vocab_size)
  mask = jnp.arange(12)[None, :] < jnp.array([[12], [7]])
  inputs = {"tokens_ExT": tokens, "mask_ExT": mask}
  logp, kl = jax.jit(agent.logprobs_and_kl)(p_new, p_old, inputs)
  kl_only = jax.jit(agent.state_kl)(p_new, p_old, inputs)
  ref_kl = scoring.state_kl(QWEN, p_new, QWEN, p_old, tokens, mask, TEMPERATURE)
  ref_logp = scoring.token_logprobs(QWEN, p_new, tokens, mask, TEMPERATURE)
  assert np.asarray(ref_kl).max() > 1e-4  # two different models
  np.testing.assert_allclose(kl_only, ref_kl, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(kl, ref_kl, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(logp, ref_logp, rtol=1e-5, atol=1e-6)
  # With positions: the same values there, 0 elsewhere.
  own = np.zeros((2, 12), bool)
  own[0, [3, 4, 9]], own[1, [2, 6]] = True, True
  inputs["positions_ExA"] = scoring.action_positions(own, multiple=4)
  logp, kl = jax.jit(agent.logprobs_and_kl)(p_new, p_old, inputs)
  for got, ref in ((logp, ref_logp), (kl, ref_kl)):
    np.testing.assert_allclose(
        np.asarray(got)[own], np.asarray(ref)[own], rtol=1e-5, atol=1e-6
    )
    assert np.all(np.asarray(got)[~own] == 0)
  np.testing.assert_allclose(
      jax.jit(agent.token_logprobs)(p_new, inputs), logp, rtol=1e-6
  )
  np.testing.assert_allclose(
      jax.jit(agent.state_kl)(p_new, p_old, inputs), kl, rtol=1e-6
  )
