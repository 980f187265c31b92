"""Tests of the warm start: tokenizer, relay-format turns, loss, checkpoint."""

import json
import pathlib
import random

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from sat_jax import config as config_lib
from sat_jax import models
from sat_jax import sft
from sat_jax import team
from sat_jax import testing
from sat_jax.tasks import arithmetic
from sat_jax.tasks import base
from sat_jax.team import transcript


@pytest.fixture(scope="module")
def task(tmp_path_factory):
  return arithmetic.ArithmeticTask(
      digits=2,
      train_size=30,
      test_size=4,
      data_dir=tmp_path_factory.mktemp("data"),
  )


@pytest.fixture(scope="module")
def tokenizer(task, tmp_path_factory):
  path = tmp_path_factory.mktemp("tok")
  examples = task.load("train")
  corpus = sft.tokenizer_corpus(task, examples, team.ProtocolConfig(), 3)
  return models.load_tokenizer(sft.build_tokenizer(path, corpus, 400))


def _small_config(**fields) -> config_lib.PretrainConfig:
  """A PretrainConfig of a 32-wide model (compiles in seconds)."""
  shape = config_lib.ModelShape(hidden_size=32, head_dim=8, mlp_dim=64)
  return config_lib.PretrainConfig(model=shape, **fields)


def test_tokenizer_splits_every_digit_and_has_chatml(tokenizer):
  ids = tokenizer("Answer: 90817", add_special_tokens=False)["input_ids"]
  pieces = [tokenizer.decode([i]) for i in ids]
  assert pieces[-5:] == ["9", "0", "8", "1", "7"]
  assert "".join(pieces) == "Answer: 90817"
  assert tokenizer.eos_token == testing.IM_END
  assert tokenizer.pad_token == testing.PAD
  assert tokenizer.chat_template == testing.CHAT_TEMPLATE
  # Merges span spaces between digits: the fixed phrase is one token.
  assert len(tokenizer("Compute ", add_special_tokens=False)["input_ids"]) == 1


def test_tokenizer_needs_room_for_bytes(tmp_path):
  with pytest.raises(ValueError, match="tokenizer_vocab_size=100"):
    sft.build_tokenizer(tmp_path, ["1+1"], 100)


def test_corrupt_digits_changes_exactly_that_many_digits():
  text = "4+5+0=9\nAnswer: 49"
  for seed in range(20):
    out = sft.corrupt_digits(text, 2, random.Random(seed))
    changed = [i for i, (a, b) in enumerate(zip(text, out)) if a != b]
    assert len(out) == len(text) and len(changed) == 2
    assert all(text[i].isdigit() and out[i].isdigit() for i in changed)
  assert sft.corrupt_digits("no digits", 3, random.Random(0)) == "no digits"


def test_relay_turn_and_its_loss_mask(task, tokenizer):
  cfg = config_lib.PretrainConfig(wrong_prob=1.0, corrupt_digits=1)
  example = task.load("train")[0]
  demo = task.demonstration(example)
  messages, viewer, train_on = sft.training_turn(
      task, example, 2, cfg, random.Random(0)
  )
  assert viewer == 2 and train_on == [3]
  assert [m.speaker for m in messages] == [transcript.TASK, 0, 1, 2]
  assert messages[3].text == demo
  assert all(m.text != demo for m in messages[1:3])  # wrong_prob=1
  renderer = sft.make_renderer(tokenizer, task, team.ProtocolConfig())
  ids, loss = sft.encode(renderer, messages, viewer, train_on)
  # The trained tokens are exactly the demonstration plus the stop token.
  trained = [i for i, m in zip(ids, loss) if m]
  assert tokenizer.decode(trained) == demo + testing.IM_END
  start = loss.index(1)
  assert all(loss[start : start + len(trained)])
  # What precedes them is the prompt the team's stream samples from: the
  # rendering of the viewer's chat with the generation prompt, tokenised.
  chat = renderer.chat(messages[:3], viewer)
  prompt = renderer.render([chat])[0]
  assert tokenizer.decode(ids[:start]) == prompt
  assert "[Agent 1] " in prompt and "[Agent 2] " in prompt
  assert prompt.startswith("<|im_start|>system\n" + task.system_prompt)


def test_split_lines_shares_lines_in_order():
  text = "a\nb\nc\nd\nAnswer: 1"
  assert sft.split_lines(text, 3) == ["a\nb", "c\nd", "Answer: 1"]
  assert sft.split_lines(text, 5) == text.split("\n")
  assert sft.split_lines(text, 1) == [text]
  with pytest.raises(ValueError, match="5-line demonstration among 6"):
    sft.split_lines(text, 6)


def test_split_relay_turn_trains_the_speakers_own_step(task):
  cfg = config_lib.PretrainConfig(
      split_demonstration=True, positions=3, wrong_prob=0.0
  )
  example = task.load("train")[0]
  lines = task.demonstration(example).split("\n")  # 2 columns + answer
  assert len(lines) == 3 and lines[-1].startswith("Answer: ")
  for position in range(3):
    messages, viewer, train_on = sft.training_turn(
        task, example, position, cfg, random.Random(0)
    )
    assert viewer == position and train_on == [position + 1]
    assert [m.text for m in messages[1:]] == lines[: position + 1]


def test_split_demonstration_needs_a_one_round_relay_of_positions():
  team_entries = tuple(config_lib.AgentEntry(name=f"a{j}") for j in range(3))
  split = config_lib.PretrainConfig(split_demonstration=True, positions=3)
  config_lib.TrainConfig(team=team_entries, pretrain=split)
  with pytest.raises(ValueError, match="pretrain.positions"):
    config_lib.TrainConfig(team=team_entries[:2], pretrain=split)
  with pytest.raises(ValueError, match="protocol"):
    config_lib.TrainConfig(
        team=team_entries,
        pretrain=split,
        protocol=config_lib.ProtocolConfig(protocol="vote"),
    )
  # A team that does not build its base from `pretrain` is not checked.
  given = config_lib.AgentEntry(name="given", model=str(pathlib.Path(".")))
  config_lib.TrainConfig(team=(given,), pretrain=split)


def test_multi_turn_tasks_train_every_assistant_turn(tmp_path, tokenizer):
  from sat_jax.tasks import registry  # pylint: disable=g-import-not-at-top

  guess = registry.get_task(
      "guess_number", train_size=4, test_size=2, data_dir=tmp_path
  )
  example = guess.load("train")[0]
  messages, viewer, train_on = sft.training_turn(
      guess, example, 2, config_lib.PretrainConfig(), random.Random(0)
  )
  demo = guess.demonstration_messages(example)
  assert viewer == 0
  assert [m.text for m in messages] == [m["content"] for m in demo]
  assert [messages[i].text for i in train_on] == [
      m["content"] for m in demo if m["role"] == "assistant"
  ]
  assert messages[0].speaker == transcript.TASK
  assert all(messages[i].speaker == 0 for i in train_on)


def test_batch_length_fits_every_multi_turn_episode(tmp_path, tokenizer):
  # guess_number's demonstration() is "Final answer: N" for every example;
  # its training turn is the whole, variable-length episode.
  from sat_jax.tasks import registry  # pylint: disable=g-import-not-at-top

  guess = registry.get_task(
      "guess_number", train_size=12, test_size=2, data_dir=tmp_path
  )
  examples = guess.load("train")
  cfg = config_lib.PretrainConfig(batch_size=8)
  renderer = sft.make_renderer(tokenizer, guess, team.ProtocolConfig())
  turns = [
      sft.encode(
          renderer, *sft.training_turn(guess, ex, 0, cfg, random.Random(0))
      )
      for ex in examples
  ]
  longest = max(len(ids) for ids, _ in turns)
  batches = sft._Batches(guess, examples, renderer, cfg, 4096)  # pylint: disable=protected-access
  assert batches.length == -(-(longest + 8) // 16) * 16
  # Every batch holds the encoded turns of the examples its rng draws.
  rng = random.Random(f"sft/{cfg.seed}")
  for _ in range(4):
    tokens, mask, loss = batches.next()
    for row in range(cfg.batch_size):
      i = rng.randrange(len(examples))
      rng.randrange(cfg.positions)
      ids, lm = turns[i]
      assert tokens[row, : len(ids)].tolist() == ids
      assert loss[row, : len(ids)].tolist() == lm
      assert mask[row].tolist() == [1] * len(ids) + [0] * (
          batches.length - len(ids)
      )


def test_relay_batch_length_is_the_longest_encoded_turn(task, tokenizer):
  cfg = config_lib.PretrainConfig(wrong_prob=0.0)
  renderer = sft.make_renderer(tokenizer, task, team.ProtocolConfig())
  examples = task.load("train")
  longest = max(
      len(
          sft.encode(
              renderer, *sft.training_turn(task, ex, p, cfg, random.Random(0))
          )[0]
      )
      for ex in examples
      for p in range(cfg.positions)
  )
  batches = sft._Batches(task, examples, renderer, cfg, 4096)  # pylint: disable=protected-access
  assert batches.length == -(-(longest + 8) // 16) * 16
  with pytest.raises(ValueError, match=f"need {batches.length} tokens.*64"):
    sft._Batches(task, examples, renderer, cfg, 64)  # pylint: disable=protected-access


def test_sft_loss_equals_a_direct_log_softmax(tokenizer):
  config = sft.model_config(
      config_lib.ModelShape(hidden_size=32, head_dim=8), tokenizer
  )
  assert config.vocab_size >= len(tokenizer) and config.vocab_size % 64 == 0
  params = jax.jit(models.init_params, static_argnums=0)(
      config, jax.random.key(0)
  )
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, len(tokenizer), (2, 24)).astype(np.int32)
  mask = np.ones((2, 24), np.int32)
  mask[1, 20:] = 0
  loss_mask = np.zeros((2, 24), np.int32)
  loss_mask[0, 5:12] = 1
  loss_mask[1, 3:20] = 1
  # sgd with lr 0: the step returns the loss at the given params.
  step = sft.make_train_step(config, optax.sgd(0.0))
  keep = jax.tree.map(jnp.copy, params)
  _, _, loss = step(params, optax.sgd(0.0).init(keep), tokens, mask, loss_mask)
  logits = np.asarray(models.forward(config, keep, tokens, mask), np.float64)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  total, count = 0.0, 0
  for b in range(2):
    for t in range(1, 24):
      if loss_mask[b, t]:
        total -= logp[b, t - 1, tokens[b, t]]
        count += 1
  assert float(loss) == pytest.approx(total / count, rel=1e-5)


def test_pretrain_writes_one_complete_folder(task, tmp_path):
  cfg = _small_config(steps=3, batch_size=4, eval_problems=2)
  out = tmp_path / "base"
  info = sft.pretrain(cfg, task, out, num_agents=1)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["base"]  # no temps
  assert json.loads((out / sft.INFO_FILE).read_text()) == info
  assert len(info["losses_every_20"]) == 1 and info["eval"]["problems"] == 2
  config, params = models.load_hf(out)
  tok = models.load_tokenizer(out)
  assert config == sft.model_config(cfg.model, tok)
  assert tok.chat_template == testing.CHAT_TEMPLATE
  # The team success it reports is that of its own predictions file.
  rows = [
      json.loads(line)
      for line in (out / "eval" / "predictions.jsonl").read_text().splitlines()
  ]
  assert info["eval"]["team_success"] == np.mean([r["correct"] for r in rows])
  assert jax.tree.leaves(params)
  with pytest.raises(FileExistsError):
    sft.pretrain(cfg, task, out)


def test_pretrain_failure_leaves_nothing(task, tmp_path, monkeypatch):
  def boom(*args, **kwargs):
    raise RuntimeError("disk full")

  def no_training(cfg, config, *args, **kwargs):
    return models.init_params(config, jax.random.key(0)), [1.0], 16, []

  monkeypatch.setattr(sft, "train", no_training)
  monkeypatch.setattr(models, "save_hf", boom)
  cfg = _small_config(steps=1, batch_size=2, eval_problems=0)
  with pytest.raises(RuntimeError, match="disk full"):
    sft.pretrain(cfg, task, tmp_path / "base")
  assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("bad_step, bad", [(3, "nan"), (22, "inf")])
def test_diverged_pretrain_raises_and_writes_nothing(
    task, tmp_path, monkeypatch, bad_step, bad
):
  def fake_step_factory(config, tx):
    del config, tx
    count = [0]

    def step(params, opt_state, *batch):
      del batch
      value = float(bad) if count[0] == bad_step else 1.0 / (1 + count[0])
      count[0] += 1
      return params, opt_state, jnp.float32(value)

    return step

  monkeypatch.setattr(sft, "make_train_step", fake_step_factory)
  cfg = _small_config(steps=25, batch_size=2, eval_problems=0)
  with pytest.raises(
      FloatingPointError,
      match=rf"loss {bad} at step {bad_step} \(pretrain.learning_rate=0.003\)",
  ):
    sft.pretrain(cfg, task, tmp_path / "base", num_agents=1)
  assert not list(tmp_path.iterdir())  # no base, no temporary folders


def _scripted_step_factory(config, tx):
  """A train step that leaves the params as they are (loss 1)."""
  del config, tx

  def step(params, opt_state, *batch):
    del batch
    return params, opt_state, jnp.float32(1.0)

  return step


def test_target_success_stops_at_the_first_check_reaching_it(
    task, tmp_path, monkeypatch
):
  # Checks every 3 steps from step 5 (steps 6, 9, 12, ...) on the last 4
  # train problems, held out of the fine-tuning data; the team's scripted
  # success reaches 0.5 at the second check, so training stops at step 9.
  successes = iter([0.25, 0.5, 1.0])
  checked, trained = [], []

  def fake_evaluate_base(config, params, tokenizer, task, examples, *a, **kw):
    out_dir = pathlib.Path(kw["out_dir"])
    out_dir.mkdir(parents=True)
    (out_dir / "predictions.jsonl").write_text("")
    if out_dir.parent.name.endswith("-checks"):  # a check, not the final eval
      checked.append((out_dir.name, [e.uid for e in examples]))
      return {"avg@1": next(successes)}
    return {"avg@1": 0.0, "agent0/avg@1": 0.0, "no_answer_rate": 0.0}

  batches = sft._Batches  # pylint: disable=protected-access

  def recording_batches(task, examples, *args):
    trained.extend(e.uid for e in examples)
    return batches(task, examples, *args)

  monkeypatch.setattr(sft, "make_train_step", _scripted_step_factory)
  monkeypatch.setattr(sft, "evaluate_base", fake_evaluate_base)
  monkeypatch.setattr(sft, "_Batches", recording_batches)
  cfg = _small_config(
      steps=20,
      batch_size=2,
      eval_problems=2,
      target_success=0.5,
      check_every=3,
      check_from=5,
      check_problems=4,
  )
  info = sft.pretrain(cfg, task, tmp_path / "base", num_agents=1)
  held_out = [e.uid for e in task.load("train")][-4:]
  assert [name for name, _ in checked] == ["step_6", "step_9"]
  assert all(uids == held_out for _, uids in checked)
  assert trained == [e.uid for e in task.load("train")][:-4]
  assert info["steps_run"] == 9
  assert info["checks"] == [
      {"step": 6, "team_success": 0.25},
      {"step": 9, "team_success": 0.5},
  ]
  assert sorted(p.name for p in (tmp_path / "base" / "checks").iterdir()) == [
      "step_6",
      "step_9",
  ]
  assert sorted(p.name for p in tmp_path.iterdir()) == ["base"]  # no temps


def test_target_success_settings_are_checked(task, tmp_path):
  for field, value in [
      ("target_success", 1.5),
      ("target_success", -0.1),
      ("check_every", 0),
      ("check_from", -1),
      ("check_problems", 0),
  ]:
    with pytest.raises(ValueError, match=f"pretrain.{field}"):
      _small_config(**{field: value})
  cfg = _small_config(steps=2, target_success=0.5, check_problems=30)
  with pytest.raises(ValueError, match="check_problems=30 leaves no training"):
    sft.pretrain(cfg, task, tmp_path / "base", num_agents=1)
  assert not list(tmp_path.iterdir())
