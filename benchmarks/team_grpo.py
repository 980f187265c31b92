"""The GRPO step workers of bench_team.py: sat_jax `single` and TRL GRPOTrainer.

Workload (both sides): bench-tiny weights and tokenizer from one folder
(team_assets.py), 8 fixed prompts x 4 generations = 32 completions of
exactly 64 new tokens at temperature 1 (no top-k / top-p, no stop), reward
`team_assets.bench_reward` of the completion text, group-normalised
advantages, the token-level clipped ratio (epsilon 0.2), AdamW (lr 1e-6,
betas 0.9 / 0.999, eps 1e-8, weight decay 0, global-norm clip 1.0), no
reference model (beta 0), float32, one optimizer step per generation batch.
A step's time is the wall time from one optimizer step's end to the next
(generation, scoring, the update, host work); the median over steps 2 on.

sat_jax: one `run_stage` per step, method "single" on a 1-agent team, epochs
= minibatches = 1 (so max_backtracks = 0: the core rejects backtracking with a
single inner step, where a raised beta cannot change the retry), beta_init 0
(the update is compiled without the KL term), delta = inf (GRPO has no trust
region, so the core skips its KL monitor), no certificate. Two rollouts:
  team    `sat_jax.team.make_rollout_fn` (relay, 1 round, 1 agent): chat
          rendering, token streams, decoding, the task verifier; stop ids
          removed from the agent's sampling options after construction so
          that every completion has exactly 64 tokens;
  team_2dev  the team path with the sampler on a mesh of its own over two
          XLA CPU devices (`make_rollout_fn(sampling_mesh=...)`, one decode
          stream of 16 rows per core; the process starts with
          `jax_num_cpu_devices=2`), the update on device 0 as in the others;
  direct  `models.render_chat` + `sampling.sample` + `TeamBatch.from_shared`
          (prompts left-padded to their bucket 16, T = 80 in all three).
TRL: `GRPOTrainer` with `generation_kwargs={"min_new_tokens": 64}` (its
eos id is masked until 64 tokens, and max_completion_length = 64 stops
there), `per_device_train_batch_size=32`, `num_generations=4`,
`gradient_accumulation_steps=1` (so generation_batch_size = 32 and
steps_per_generation = 1), `num_iterations=1` (no old-log-prob pass),
`beta=0`, `bf16=False`, `gradient_checkpointing=False`, `use_cpu=True`.
"""

import functools
import statistics
import time
from typing import Any

import numpy as np

import team_assets

NUM_PROMPTS, GROUP, NEW_TOKENS = 8, 4, 64
SAMPLER_DEVICES_2 = "team_2dev"  # the path whose sampler has two devices
LEARNING_RATE, EPSILON, GRAD_CLIP = 1e-6, 0.2, 1.0


def _sat_config():
  from sat_jax.core import config as core_config  # pylint: disable=g-import-not-at-top

  update = core_config.UpdateConfig(
      ratio_mode="token",
      epsilon=EPSILON,
      epochs=1,
      minibatches=1,
      optimizer=core_config.OptimizerConfig(
          name="adamw",
          learning_rate=LEARNING_RATE,
          weight_decay=0.0,
          grad_clip=GRAD_CLIP,
      ),
  )
  return core_config.SATConfig(
      method="single",
      max_backtracks=0,
      beta_init=0.0,
      delta=float("inf"),
      certificate=None,
      update=update,
  )


def _team_rollout(agent, tokenizer, sampler_devices=1):
  """The team path, with the stop ids taken out of the sampling options."""
  import dataclasses  # pylint: disable=g-import-not-at-top

  from sat_jax import sharding  # pylint: disable=g-import-not-at-top
  from sat_jax import team  # pylint: disable=g-import-not-at-top

  sampling_mesh = None
  if sampler_devices > 1:
    sampling_mesh = sharding.make_mesh(
        sharding.MeshConfig(num_devices=sampler_devices)
    )

  task = team_assets.BenchTask(NUM_PROMPTS)
  protocol = team.ProtocolConfig(
      protocol="relay",
      rounds=1,
      max_new_tokens=NEW_TOKENS,
      view_buckets=tuple(range(16, 1025, 16)),
      min_rows=NUM_PROMPTS * GROUP,
  )
  rollout = team.make_rollout_fn(
      (agent,),
      (tokenizer,),
      task,
      task.load("train"),
      protocol,
      num_prompts=NUM_PROMPTS,
      group_size=GROUP,
      sampling_mesh=sampling_mesh,
  )
  speaker = rollout.speaker
  speaker.options = [
      dataclasses.replace(o, stop_token_ids=()) for o in speaker.options
  ]
  return rollout


def _direct_rollout(config, tokenizer):
  """(params, key) -> TeamBatch: render, sample, decode, score, batch."""
  import jax  # pylint: disable=g-import-not-at-top

  from sat_jax import models  # pylint: disable=g-import-not-at-top
  from sat_jax import sampling  # pylint: disable=g-import-not-at-top
  from sat_jax import scoring  # pylint: disable=g-import-not-at-top
  from sat_jax.core import batch as batch_lib  # pylint: disable=g-import-not-at-top

  options = sampling.SamplingOptions(
      max_new_tokens=NEW_TOKENS,
      temperature=1.0,
      top_p=1.0,
      top_k=0,
      stop_token_ids=(),
      pad_token_id=tokenizer.pad_token_id,
  )
  prompts = team_assets.bench_prompts(NUM_PROMPTS)
  group_E = np.repeat(np.arange(NUM_PROMPTS, dtype=np.int32), GROUP)

  def rollout(params, key):
    ids = [
        models.render_chat(tokenizer, team_assets.bench_messages(p))
        for p in prompts
    ]
    tokens_BxP, mask_BxP = sampling.pad_prompts(
        [ids[g] for g in group_E], options
    )
    out = sampling.sample(config, params[0], tokens_BxP, mask_BxP, options, key)
    new_BxN, logp_BxN = jax.device_get((out.tokens_BxN, out.logprobs_BxN))
    texts = tokenizer.batch_decode(new_BxN.tolist(), skip_special_tokens=True)
    p = tokens_BxP.shape[1]
    tokens_ExT = np.concatenate([tokens_BxP, new_BxN], axis=1)
    mask_ExT = np.concatenate([mask_BxP, np.ones_like(new_BxN)], axis=1)
    agent_ExT = np.full(tokens_ExT.shape, -1, np.int32)
    agent_ExT[:, p:] = 0
    logp_ExT = np.zeros(tokens_ExT.shape, np.float32)
    logp_ExT[:, p:] = logp_BxN
    inputs = {
        "tokens_ExT": jax.device_put(tokens_ExT),
        "mask_ExT": jax.device_put(mask_ExT),
    }
    # One agent: its own tokens are the completions, scored there only (as
    # the team path's views do; TRL computes the head on them alone too).
    positions = scoring.action_positions(agent_ExT == 0)
    if positions is not None:
      inputs["positions_ExA"] = jax.device_put(positions)
    return batch_lib.TeamBatch.from_shared(
        inputs,
        agent_ExT,
        logp_ExT,
        agent_ExT == 0,
        np.asarray([team_assets.bench_reward(t) for t in texts], np.float32),
        group_E,
        num_agents=1,
        num_groups=NUM_PROMPTS,
    )

  return rollout


def _lean_update(agent, tx):
  """A jitted GRPO update without any KL term (a profiling reference only).

  The token-ratio clipped surrogate of the core's "token" mode, one AdamW
  step; it shows what the step costs without the core's in-update KL
  penalty and post-update monitor.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top

  @jax.jit
  def step(params, opt_state, view, adv_E):
    def loss(p):
      logp_ExT = agent.token_logprobs(p, view.inputs)
      r_ExT = jnp.exp(
          jnp.where(view.mask_ExT, logp_ExT - view.behaviour_logp_ExT, 0.0)
      )
      adv_ExT = adv_E[:, None]
      s_ExT = jnp.minimum(
          r_ExT * adv_ExT, jnp.clip(r_ExT, 1 - EPSILON, 1 + EPSILON) * adv_ExT
      )
      return -jnp.sum(jnp.where(view.mask_ExT, s_ExT, 0.0)) / jnp.sum(
          view.mask_ExT
      )

    grads = jax.grad(loss)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  return step


def _median_from(times, skip=1):
  return statistics.median(times[skip:]) if len(times) > skip else None


def _run_steps(agent, cfg, params, raw_rollout, num_steps, key):
  """`num_steps` timed `run_stage` calls: (phase dict per step, 1st batch)."""
  import jax  # pylint: disable=g-import-not-at-top
  import team_phases  # pylint: disable=g-import-not-at-top

  from sat_jax.core import agent as agent_lib  # pylint: disable=g-import-not-at-top
  from sat_jax.core import stage  # pylint: disable=g-import-not-at-top

  timer, first = team_phases.PhaseTimer(), []

  def rollout(p, k):
    batch = raw_rollout(p, k)
    if not first:
      first.append(batch)
    return batch

  # init_team's optimizer state comes out uncommitted as well (see sat_grpo).
  state = jax.device_put(
      agent_lib.init_team((agent,), (params,), cfg), jax.devices()[0]
  )
  steps = []
  with timer.installed():
    for i in range(num_steps):
      cpu0 = time.process_time()
      state, record, phases = team_phases.timed_stage(
          stage.run_stage,
          timer,
          (agent,),
          state,
          timer.rollout(rollout),
          cfg,
          jax.random.fold_in(key, i),
      )
      phases["cpu_s"] = time.process_time() - cpu0
      phases["accepted"] = bool(record.steps[0]["accepted"])
      phases["reward"] = record.mean_reward
      steps.append(phases)
  return steps, first[0]


def _path_result(agent, params, steps, batch) -> dict[str, Any]:
  """Step medians, phase medians and the pre-update consistency check."""
  import jax  # pylint: disable=g-import-not-at-top
  import team_phases  # pylint: disable=g-import-not-at-top

  view = batch.views[0]
  # Before any update the recomputed log-probs equal the behaviour ones.
  logp = jax.jit(agent.token_logprobs)(params, view.inputs)
  mask = np.asarray(view.mask_ExT)
  diff = np.abs(np.asarray(logp) - np.asarray(view.behaviour_logp_ExT))
  times = [s["stage_s"] for s in steps]
  res = {
      "steps": steps,
      "times_s": times,
      "median_s": _median_from(times),
      "median_cpu_s": _median_from([s["cpu_s"] for s in steps]),
      "first_s": times[0],
      "tokens_shape": list(view.inputs["tokens_ExT"].shape),
      "own_tokens_per_row": sorted(set(mask.sum(1).tolist())),
      # Real (unpadded) prompt tokens of each row: the FLOP count's input.
      "prompt_tokens_per_row": (
          (np.asarray(view.inputs["mask_ExT"]).sum(1) - mask.sum(1)).tolist()
      ),
      "head_positions_per_row": (
          view.inputs["positions_ExA"].shape[1]
          if "positions_ExA" in view.inputs
          else None
      ),
      "logp_max_abs_diff": float(np.where(mask, diff, 0.0).max()),
  }
  for phase in team_phases.PHASES + ("other",):
    res[f"median_{phase}_s"] = _median_from([s[f"{phase}_s"] for s in steps])
  return res


def sat_grpo(args: dict[str, Any]) -> dict[str, Any]:
  """Both sat_jax rollouts, `args["steps"]` steps each, in one process."""
  import jax  # pylint: disable=g-import-not-at-top

  from sat_jax import models  # pylint: disable=g-import-not-at-top
  from sat_jax import team  # pylint: disable=g-import-not-at-top

  if SAMPLER_DEVICES_2 in args["paths"]:
    # Before JAX starts its CPU backend; the other paths use device 0 only.
    jax.config.update("jax_num_cpu_devices", 2)
  config, params = models.load_hf(args["ckpt"])
  # load_hf gives uncommitted arrays and every update returns committed
  # ones, which jit keys apart: without this, step 2 compiles the sampler
  # and the update a second time.
  params = jax.device_put(params, jax.devices()[0])
  tokenizer = models.load_tokenizer(args["ckpt"])
  agent = team.LMAgent(config, temperature=1.0)
  cfg = _sat_config()
  key = jax.random.key(args.get("seed", 0))
  result = {"side": "sat_jax", "devices": str(jax.devices())}
  for path in args["paths"]:
    if path == "direct":
      raw = _direct_rollout(config, tokenizer)
    else:
      devices = 2 if path == SAMPLER_DEVICES_2 else 1
      raw = _team_rollout(agent, tokenizer, sampler_devices=devices)
    steps, batch = _run_steps(agent, cfg, params, raw, args["steps"], key)
    result[path] = _path_result(agent, params, steps, batch)
  result["lean_update"] = _time_lean(agent, cfg, params, batch, args)
  return result


def _time_lean(agent, cfg, params, batch, args) -> dict[str, Any]:
  """Times `_lean_update` and the core's update_agent on one batch."""
  import jax  # pylint: disable=g-import-not-at-top

  from sat_jax.core import advantage  # pylint: disable=g-import-not-at-top
  from sat_jax.core import agent as agent_lib  # pylint: disable=g-import-not-at-top
  from sat_jax.core import objective  # pylint: disable=g-import-not-at-top

  view = batch.views[0]
  adv = advantage.sequence_advantages(
      batch.reward_E,
      batch.group_E,
      jax.numpy.zeros_like(batch.reward_E),
      num_groups=batch.num_groups,
      a_clip=cfg.a_clip,
      std_eps=cfg.std_eps,
  )
  tx = agent_lib.make_optimizer(cfg.update.optimizer)
  opt_state = jax.jit(tx.init)(params)
  lean = _lean_update(agent, tx)
  core = functools.partial(
      objective.update_agent,
      agent,
      cfg.update,
      params,
      opt_state,
      params,
      agent_lib.scalar(0.0),
      agent_lib.scalar(1.0),
      agent_lib.scalar(1e9),
      view,
      adv.adv_E,
      adv.c_E,
      jax.random.key(0),
  )
  score = jax.jit(agent.token_logprobs)
  kl = jax.jit(agent.state_kl)
  calls = {
      "lean_update": lambda: lean(params, opt_state, view, adv.adv_E),
      # As the GRPO step runs it (beta 0, delta inf, no certificate: no
      # pass over the new params) and with SAT's monitor.
      "core_update_agent": lambda: core(
          kl_penalty=False, monitor=False, measure_new=False
      ),
      "core_update_agent_monitored": lambda: core(
          kl_penalty=False, monitor=True
      ),
      "token_logprobs": lambda: score(params, view.inputs),
      "state_kl": lambda: kl(params, params, view.inputs),
  }
  out = {}
  for name, fn in calls.items():
    jax.block_until_ready(fn())  # compile
    times = []
    for _ in range(args.get("repeats", 5)):
      t0 = time.perf_counter()
      jax.block_until_ready(fn())
      times.append(time.perf_counter() - t0)
    out[name] = statistics.median(times)
  return out


def trl_grpo(args: dict[str, Any]) -> dict[str, Any]:
  """TRL GRPOTrainer for `args["steps"]` optimizer steps (module docstring)."""
  import tempfile  # pylint: disable=g-import-not-at-top

  import datasets  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  import trl  # pylint: disable=g-import-not-at-top

  torch.set_num_threads(args["threads"])
  torch.manual_seed(args.get("seed", 0))
  model = transformers.AutoModelForCausalLM.from_pretrained(
      args["ckpt"], dtype=torch.float32
  )
  tok = transformers.AutoTokenizer.from_pretrained(
      args["ckpt"], local_files_only=True
  )
  prompts = team_assets.bench_prompts(NUM_PROMPTS)
  dataset = datasets.Dataset.from_list(
      [{"prompt": team_assets.bench_messages(p)} for p in prompts]
  )

  def reward(completions, **kwargs):
    del kwargs
    return [team_assets.bench_reward(c[0]["content"]) for c in completions]

  ends, cpu_ends = [], []

  class StepTimes(transformers.TrainerCallback):

    def on_train_begin(self, *a, **k):
      ends.append(time.perf_counter())
      cpu_ends.append(time.process_time())

    def on_step_end(self, *a, **k):
      ends.append(time.perf_counter())
      cpu_ends.append(time.process_time())

  with tempfile.TemporaryDirectory() as tmp:
    cfg = trl.GRPOConfig(
        output_dir=tmp,
        max_steps=args["steps"],
        per_device_train_batch_size=NUM_PROMPTS * GROUP,
        num_generations=GROUP,
        gradient_accumulation_steps=1,
        num_iterations=1,
        max_completion_length=NEW_TOKENS,
        generation_kwargs={"min_new_tokens": NEW_TOKENS},
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        epsilon=EPSILON,
        learning_rate=LEARNING_RATE,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch",
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        weight_decay=0.0,
        max_grad_norm=GRAD_CLIP,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=args.get("seed", 0),
    )
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=cfg,
        train_dataset=dataset,
        processing_class=tok,
        callbacks=[StepTimes()],
    )
    trainer.train()
  times = list(np.diff(ends))
  logs = [h for h in trainer.state.log_history if "completions/min_length" in h]
  return {
      "side": "trl",
      "trl_version": trl.__version__,
      "threads": torch.get_num_threads(),
      "times_s": times,
      "median_s": _median_from(times),
      "median_cpu_s": _median_from(list(np.diff(cpu_ends))),
      "first_s": times[0] if times else None,
      "completion_min_length": min(h["completions/min_length"] for h in logs),
      "completion_max_length": max(h["completions/max_length"] for h in logs),
      "loss_type": cfg.loss_type,
      "generation_batch_size": cfg.generation_batch_size,
      "steps_per_generation": cfg.steps_per_generation,
  }
