"""Supervised warm start: a tiny LM fine-tuned on task demonstrations.

`pretrain(cfg, task, out_dir)` builds (or loads) a tokenizer, trains a
randomly initialised model on demonstration turns with one jitted step, and
writes a base checkpoint: HF safetensors (`models.save_hf`), the tokenizer
(`save_pretrained`) and `pretrain.json` (settings, losses, held-out
success; with `target_success`, every check's success and its predictions
under checks/), all in one folder that appears atomically (built under a
temporary name, renamed into place).

Training turns are in the relay format of the team rollout, rendered by
`sat_jax.team.transcript.Renderer` exactly as a rollout renders them (earlier
speakers' messages as tagged user turns): the speaker at position p sees the
prompt and p earlier messages, each a correct demonstration or (with probability
wrong_prob) one with a few digits changed, and is trained to give the
correct demonstration regardless. So the team's later speakers learn to
check, not copy, and the first speaker learns the plain task (p = 0).
With `split_demonstration` the speakers share the demonstration's lines
instead (`split_lines`): each writes its step after the earlier steps, and
the last one the answer, so that each speaker's step decides the team's
answer.
Multi-turn tasks train on every assistant turn of
`task.demonstration_messages` (p = 0 only). The loss is the mean negative
log-likelihood of the trained messages' tokens, up to and including the
end-of-turn token:

  L(theta) = - sum_t m_t log p_theta(x_t | x_<t) / sum_t m_t.

The demo tokenizer is a byte-level BPE trained on the task's text with every
digit its own token (merges never cross a digit) and, between digits, merges
free to span spaces (so the fixed system prompt costs a few tokens), ChatML
special tokens and template (`testing.CHAT_TEMPLATE`); eos is <|im_end|>.
"""

import dataclasses
import functools
import os
import pathlib
import random
import shutil
import time
import uuid
from typing import Any, Callable, Sequence

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm

from sat_jax import config as config_lib
from sat_jax import io_utils
from sat_jax import models
from sat_jax import scoring
from sat_jax import team
from sat_jax import testing
from sat_jax.eval import runner
from sat_jax.tasks import base
from sat_jax.team import transcript

PyTree = Any
Message = transcript.Message
TASK, ENV = transcript.TASK, transcript.ENV
INFO_FILE = "pretrain.json"
_LENGTH_MULTIPLE = 16


def tokenizer_corpus(
    task: base.Task,
    examples: Sequence[base.Example],
    protocol: team.ProtocolConfig,
    num_agents: int,
) -> list[str]:
  """The text a team sees, per example: the chat roles, the system prompt,
  the prompt, the demonstration and the agent tags (special tokens apart)."""
  tags = [
      protocol.agent_tag.format(number=j + 1, index=j)
      for j in range(num_agents)
  ]
  lines = []
  for ex in examples:
    lines += ["system\n", "user\n", "assistant\n", *tags]
    lines += [task.system_prompt or "", ex.prompt, task.demonstration(ex)]
  return lines


def build_tokenizer(
    path: str | os.PathLike, corpus: Sequence[str], vocab_size: int
) -> pathlib.Path:
  """Trains and saves a digit-splitting byte-level BPE with a chat template."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  pre = tokenizers.pre_tokenizers
  bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
  bpe.pre_tokenizer = pre.Sequence([
      pre.Digits(individual_digits=True),
      pre.ByteLevel(add_prefix_space=False, use_regex=False),
  ])
  bpe.decoder = tokenizers.decoders.ByteLevel()
  floor = 256 + len(testing.SPECIAL_TOKENS)
  if vocab_size < floor:
    raise ValueError(
        f"pretrain.tokenizer_vocab_size={vocab_size}: must be >= {floor} (the"
        " byte alphabet plus the special tokens)"
    )
  trainer = tokenizers.trainers.BpeTrainer(
      vocab_size=vocab_size,
      special_tokens=list(testing.SPECIAL_TOKENS),
      initial_alphabet=pre.ByteLevel.alphabet(),
      show_progress=False,
  )
  bpe.train_from_iterator(list(corpus), trainer=trainer)
  tok = transformers.PreTrainedTokenizerFast(
      tokenizer_object=bpe,
      eos_token=testing.IM_END,
      pad_token=testing.PAD,
      unk_token=None,
  )
  tok.chat_template = testing.CHAT_TEMPLATE
  path = pathlib.Path(path)
  tok.save_pretrained(str(path))
  return path


def corrupt_digits(text: str, count: int, rng: random.Random) -> str:
  """`text` with `count` distinct digit characters each changed."""
  where = [i for i, ch in enumerate(text) if ch.isdigit()]
  chars = list(text)
  for i in rng.sample(where, min(count, len(where))):
    chars[i] = rng.choice([d for d in "0123456789" if d != chars[i]])
  return "".join(chars)


def training_turn(
    task: base.Task,
    example: base.Example,
    position: int,
    cfg: config_lib.PretrainConfig,
    rng: random.Random,
) -> tuple[list[Message], int, list[int]]:
  """(transcript, viewer, indices of the messages to train on).

  See the module docstring; the transcript is in `sat_jax.team` terms.
  """
  if task.make_environment(example) is not None:
    messages = []
    for i, m in enumerate(task.demonstration_messages(example)):
      who = 0 if m["role"] == "assistant" else TASK if i == 0 else ENV
      messages.append(Message(who, m["content"]))
    return messages, 0, [i for i, m in enumerate(messages) if m.speaker == 0]
  demo = task.demonstration(example)
  if cfg.split_demonstration:
    shares = split_lines(demo, cfg.positions)
  else:
    shares = [demo] * cfg.positions
  messages = [Message(TASK, example.prompt)]
  for j in range(position):
    wrong = rng.random() < cfg.wrong_prob
    text = shares[j]
    if wrong:
      text = corrupt_digits(text, cfg.corrupt_digits, rng)
    messages.append(Message(j, text, 0))
  messages.append(Message(position, shares[position], 0))
  return messages, position, [len(messages) - 1]


def split_lines(text: str, parts: int) -> list[str]:
  """`text`'s lines in `parts` contiguous non-empty shares, in order.

  Shares differ in size by at most one line, the larger ones first, so the
  last share ends with the last line (a worked answer's `Answer:` line).
  """
  lines = text.split("\n")
  if len(lines) < parts:
    raise ValueError(
        f"cannot share a {len(lines)}-line demonstration among {parts}"
        f" speakers: {text!r}"
    )
  size, extra = divmod(len(lines), parts)
  shares, start = [], 0
  for p in range(parts):
    end = start + size + (p < extra)
    shares.append("\n".join(lines[start:end]))
    start = end
  return shares


def _chat_dicts(
    renderer: transcript.Renderer, messages: Sequence[Message], viewer: int
) -> tuple[list[dict[str, str]], int]:
  """(viewer's chat as role/content dicts, index of messages[0] in it)."""
  chat = renderer.chat(messages, viewer)
  offset = len(chat) - len(messages)  # the system turn, if any
  return [{"role": r, "content": c} for r, c in chat], offset


def _render_fn(renderer: transcript.Renderer):
  return functools.partial(
      models.render_chat, renderer.tokenizer, chat_template=renderer.template
  )


def rendered_length(
    renderer: transcript.Renderer, messages: Sequence[Message], viewer: int
) -> int:
  """len(encode(renderer, messages, viewer, ...)[0]), in one rendering."""
  as_dicts, _ = _chat_dicts(renderer, messages, viewer)
  return len(_render_fn(renderer)(as_dicts, add_generation_prompt=False))


def encode(
    renderer: transcript.Renderer,
    messages: Sequence[Message],
    viewer: int,
    train_on: Sequence[int],
) -> tuple[list[int], list[int]]:
  """(ids, loss mask) of `viewer`'s rendering; 1 on trained messages + eos.

  Each trained message's tokens start where the rendering of the transcript
  before it, with the generation prompt, ends (what the team's token stream
  would have sampled from); that rendering must be a prefix of the whole
  one, or the template rewrites earlier turns and ValueError is raised.
  """
  as_dicts, offset = _chat_dicts(renderer, messages, viewer)
  render = _render_fn(renderer)
  full = render(as_dicts, add_generation_prompt=False)
  loss = [0] * len(full)
  eos = set(renderer.stop_ids)
  for i in train_on:
    prefix = render(as_dicts[: offset + i])
    if full[: len(prefix)] != prefix:
      raise ValueError(
          f"{renderer.name}: the rendering before message {i} is not a prefix"
          " of the whole conversation (the chat template or tokenizer"
          " rewrites earlier turns)"
      )
    end = next(
        (t for t in range(len(prefix), len(full)) if full[t] in eos), None
    )
    if end is None:
      raise ValueError(
          f"{renderer.name}: message {i} has no stop token after it"
      )
    loss[len(prefix) : end + 1] = [1] * (end + 1 - len(prefix))
  return full, loss


def make_train_step(
    config: models.ModelConfig, tx: optax.GradientTransformation
):
  """The jitted SFT step: (params, opt_state, batch) -> (params, opt, loss)."""

  def loss_fn(params, tokens_BxT, mask_BxT, loss_BxT):
    logp_BxT = scoring.token_logprobs(config, params, tokens_BxT, mask_BxT)
    total = jnp.sum(jnp.where(loss_BxT > 0, logp_BxT, 0.0))
    return -total / jnp.maximum(jnp.sum(loss_BxT), 1)

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def step(params, opt_state, tokens_BxT, mask_BxT, loss_BxT):
    loss, grads = jax.value_and_grad(loss_fn)(
        params, tokens_BxT, mask_BxT, loss_BxT
    )
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return step


def _optimizer(cfg: config_lib.PretrainConfig) -> optax.GradientTransformation:
  schedule = optax.warmup_cosine_decay_schedule(
      0.0,
      cfg.learning_rate,
      max(cfg.warmup_steps, 1),
      max(cfg.steps, cfg.warmup_steps + 1),
      end_value=0.1 * cfg.learning_rate,
  )
  return optax.chain(
      optax.clip_by_global_norm(1.0),
      optax.adamw(schedule, weight_decay=cfg.weight_decay),
  )


def model_config(
    shape: config_lib.ModelShape, tokenizer: Any
) -> models.ModelConfig:
  """The ModelConfig of `shape` with a vocab that fits the tokenizer."""
  vocab = -(-len(tokenizer) // 64) * 64  # padded, as real vocabularies are
  return models.ModelConfig(
      family=shape.family,
      vocab_size=vocab,
      hidden_size=shape.hidden_size,
      num_layers=shape.num_layers,
      num_heads=shape.num_heads,
      num_kv_heads=shape.num_kv_heads,
      head_dim=shape.head_dim,
      mlp_dim=shape.mlp_dim,
      max_seq_len=shape.max_seq_len,
      tie_embeddings=shape.tie_embeddings,
      rope_theta=shape.rope_theta,
  )


class _Batches:
  """Random training turns of one viewer each, padded to one fixed [B, T].

  T fits the longest turn that can be packed: every example is rendered at
  every position, since the longest demonstration string is not the longest
  turn (a multi-turn task's `demonstration` is its final answer only, and
  more characters can be fewer tokens). Relay turns are sized uncorrupted:
  corruption changes digits only, one token each with the digit-splitting
  demo tokenizer, and the margin absorbs a few more from other tokenizers.
  """

  def __init__(self, task, examples, renderer, cfg, max_len: int):
    self.task, self.examples, self.cfg = task, examples, cfg
    self.renderer = renderer
    self.rng = random.Random(f"sft/{cfg.seed}")
    # A multi-turn example has one training turn whatever the position and
    # rng, and its scripted episode can be slow to build: encoded once here,
    # it sizes T and is reused by every batch.
    self.fixed: dict[int, tuple[list[int], list[int]]] = {}
    exact = dataclasses.replace(cfg, wrong_prob=0.0)
    longest = 0
    for i, ex in enumerate(examples):
      if task.make_environment(ex) is not None:
        turn = training_turn(task, ex, 0, cfg, random.Random(0))
        self.fixed[i] = encode(renderer, *turn)
        longest = max(longest, len(self.fixed[i][0]))
        continue
      for position in range(cfg.positions):
        messages, viewer, _ = training_turn(
            task, ex, position, exact, random.Random(0)
        )
        longest = max(longest, rendered_length(renderer, messages, viewer))
    self.length = -(-(longest + 8) // _LENGTH_MULTIPLE) * _LENGTH_MULTIPLE
    if self.length > max_len:
      raise ValueError(
          f"training turns need {self.length} tokens, more than the model's"
          f" max_seq_len {max_len} (pretrain.model.max_seq_len)"
      )

  def next(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    b, t = self.cfg.batch_size, self.length
    tokens = np.full((b, t), self.renderer.pad_id, np.int32)
    mask = np.zeros((b, t), np.int32)
    loss = np.zeros((b, t), np.int32)
    for row in range(b):
      i = self.rng.randrange(len(self.examples))
      position = self.rng.randrange(self.cfg.positions)
      if i in self.fixed:
        ids, lm = self.fixed[i]
      else:
        turn = training_turn(
            self.task, self.examples[i], position, self.cfg, self.rng
        )
        ids, lm = encode(self.renderer, *turn)
      if len(ids) > t:
        raise ValueError(
            f"{self.examples[i].uid}: a training turn of {len(ids)} tokens"
            f" exceeds {t}"
        )
      tokens[row, : len(ids)] = ids
      mask[row, : len(ids)] = 1
      loss[row, : len(ids)] = lm
    return tokens, mask, loss


def make_renderer(
    tokenizer: Any, task: base.Task, protocol: team.ProtocolConfig
) -> transcript.Renderer:
  """The renderer a rollout of `protocol` on `task` would use."""
  return transcript.Renderer(
      tokenizer,
      system_prompt=task.system_prompt,
      agent_tag=protocol.agent_tag,
      env_tag=protocol.env_tag,
  )


def train(
    cfg: config_lib.PretrainConfig,
    config: models.ModelConfig,
    renderer: transcript.Renderer,
    task: base.Task,
    examples: Sequence[base.Example],
    *,
    check: Callable[[PyTree, int], float] | None = None,
    progress: bool = False,
) -> tuple[PyTree, list[float], int, list[dict[str, float]]]:
  """SFT steps from a random init: (params, losses, T, checks).

  cfg.steps steps, or fewer with cfg.target_success > 0: then every
  cfg.check_every steps from cfg.check_from on, `check(params, step)` gives
  the team's success, and training stops after the first check that reaches
  the target. `checks` lists {"step", "team_success"} of every check made.
  """
  if cfg.target_success > 0 and check is None:
    raise ValueError("pretrain.target_success > 0 needs a check function")
  batches = _Batches(task, examples, renderer, cfg, config.max_seq_len)
  init = jax.jit(models.init_params, static_argnums=(0,))
  params = init(config, jax.random.key(cfg.seed))
  tx = _optimizer(cfg)
  opt_state = jax.jit(tx.init)(params)
  step = make_train_step(config, tx)
  losses, pending, checks = [], [], []

  def fetch_losses():
    block = [float(v) for v in jax.device_get(pending)]
    # A diverged model must not be saved as a finished base: stop here,
    # before pretrain() writes anything.
    bad = next((j for j, v in enumerate(block) if not np.isfinite(v)), None)
    if bad is not None:
      bar.close()
      raise FloatingPointError(
          f"pretrain diverged: loss {block[bad]} at step {len(losses) + bad}"
          f" (pretrain.learning_rate={cfg.learning_rate}); lower the"
          " learning rate or add warmup steps"
      )
    losses.extend(block)
    pending.clear()

  bar = tqdm.tqdm(range(cfg.steps), desc="pretrain", disable=not progress)
  for i in bar:
    tokens, mask, loss = jax.device_put(batches.next())
    params, opt_state, value = step(params, opt_state, tokens, mask, loss)
    pending.append(value)
    checking = (
        cfg.target_success > 0
        and i + 1 >= cfg.check_from
        and (i + 1) % cfg.check_every == 0
    )
    if len(pending) == 20 or i == cfg.steps - 1 or checking:  # in blocks
      fetch_losses()
      bar.set_postfix(loss=f"{losses[-1]:.3f}")
    if checking:
      success = float(check(params, i + 1))
      checks.append({"step": i + 1, "team_success": success})
      logging.info("pretrain step %d: team success %.3f", i + 1, success)
      if success >= cfg.target_success:
        break
  bar.close()
  return params, losses, batches.length, checks


def evaluate_base(
    config: models.ModelConfig,
    params: PyTree,
    tokenizer: Any,
    task: base.Task,
    examples: Sequence[base.Example],
    protocol: team.ProtocolConfig,
    *,
    num_agents: int,
    temperature: float,
    out_dir: str | os.PathLike,
    seed: int = 0,
) -> dict[str, Any]:
  """Held-out success of a `protocol` team of `num_agents` base copies.

  One sample per problem at `temperature`; `agent0/avg@1` is the first
  speaker's own success, `avg@1` the team's.
  """
  agents = [team.LMAgent(config, temperature)] * num_agents
  generate = team.make_generate_fn(
      agents, [tokenizer] * num_agents, task, protocol, [params] * num_agents
  )
  return runner.evaluate(
      task,
      examples,
      generate,
      1,
      jax.random.key(seed),
      out_dir,
      progress=False,
      batch_size=len(examples),
  )


def pretrain(
    cfg: config_lib.PretrainConfig,
    task: base.Task,
    out_dir: str | os.PathLike,
    *,
    protocol: team.ProtocolConfig = team.ProtocolConfig(),
    num_agents: int = 3,
    progress: bool = False,
) -> dict[str, Any]:
  """Builds the base checkpoint folder `out_dir` (module docstring).

  Returns the info dict also saved as out_dir/pretrain.json. Raises
  FileExistsError if out_dir exists, and FloatingPointError (writing
  nothing) if the loss becomes NaN or infinite.
  """
  out_dir = pathlib.Path(out_dir)
  if out_dir.exists():
    raise FileExistsError(f"{out_dir} exists; remove it or pick another")
  start = time.perf_counter()
  train_examples = list(task.load("train"))
  test_examples = list(task.load("test"))[: cfg.eval_problems]
  out_dir.parent.mkdir(parents=True, exist_ok=True)
  tmp = out_dir.parent / f".{out_dir.name}.tmp-{uuid.uuid4().hex[:8]}"
  tmp_tok = tmp.with_name(tmp.name + "-tok")
  tmp_checks = tmp.with_name(tmp.name + "-checks")  # save_hf makes tmp itself
  try:
    tok_dir = cfg.tokenizer
    if tok_dir is None:
      tok_dir = build_tokenizer(
          tmp_tok,
          tokenizer_corpus(task, train_examples, protocol, num_agents),
          cfg.tokenizer_vocab_size,
      )
    tokenizer = models.load_tokenizer(tok_dir)
    config = model_config(cfg.model, tokenizer)
    models.check_fits(tokenizer, config)
    renderer = make_renderer(tokenizer, task, protocol)
    check = None
    if cfg.target_success > 0:
      if cfg.check_problems >= len(train_examples):
        raise ValueError(
            f"pretrain.check_problems={cfg.check_problems} leaves no training"
            f" problems of the {len(train_examples)} in {task.name}'s train"
            " split"
        )
      check_examples = train_examples[-cfg.check_problems :]
      train_examples = train_examples[: -cfg.check_problems]

      def check(params, step):
        return evaluate_base(
            config,
            params,
            tokenizer,
            task,
            check_examples,
            protocol,
            num_agents=num_agents,
            temperature=cfg.eval_temperature,
            out_dir=tmp_checks / f"step_{step}",
            seed=cfg.seed,
        )["avg@1"]

    params, losses, seq_len, checks = train(
        cfg,
        config,
        renderer,
        task,
        train_examples,
        check=check,
        progress=progress,
    )
    train_s = time.perf_counter() - start
    models.save_hf(
        tmp,
        config,
        params,
        extra_config={
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        },
    )
    tokenizer.save_pretrained(str(tmp))
    if tmp_checks.exists():
      os.replace(tmp_checks, tmp / "checks")
    info = {
        "task": task.name,
        "settings": config_lib.to_plain(cfg),
        "num_params": models.num_params(config),
        "vocab_size": config.vocab_size,
        "tokenizer_size": len(tokenizer),
        "sequence_length": seq_len,
        "loss_first": losses[0] if losses else None,
        "loss_last": float(np.mean(losses[-20:])) if losses else None,
        "losses_every_20": losses[::20],
        "steps_run": len(losses),
        "checks": checks,
        "train_s": round(train_s, 1),
    }
    if test_examples:
      summary = evaluate_base(
          config,
          params,
          tokenizer,
          task,
          test_examples,
          protocol,
          num_agents=num_agents,
          temperature=cfg.eval_temperature,
          out_dir=tmp / "eval",
          seed=cfg.seed,
      )
      info["eval"] = {
          "problems": len(test_examples),
          "temperature": cfg.eval_temperature,
          "protocol": protocol.protocol,
          "num_agents": num_agents,
          "solo_success": summary.get("agent0/avg@1"),
          "team_success": summary["avg@1"],
          "no_answer_rate": summary["no_answer_rate"],
      }
    info["total_s"] = round(time.perf_counter() - start, 1)
    io_utils.atomic_write_json(tmp / INFO_FILE, info)
    os.replace(tmp, out_dir)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(tmp_tok, ignore_errors=True)
    shutil.rmtree(tmp_checks, ignore_errors=True)
  logging.info("pretrained base in %s: %s", out_dir, info)
  return info
