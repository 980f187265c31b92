"""The demo: a relay team of 3 tiny LMs learns 3-digit addition with SAT.

  sat-jax train --config experiments/demo.py                # runs/demo
  sat-jax train --config experiments/demo.py --config.sat.method=joint \\
      --workdir runs/demo_joint
  sat-jax train --config experiments/demo.py:method=single  # runs/demo_single

What it does: the warm start (`sat-jax pretrain`, inside the run unless
runs/<name>/pretrain/base exists) fine-tunes one tiny Qwen3-style model from
scratch on worked answers in the relay format; the three agents start from
it. Then SAT stages (relay protocol, `reuse` advantages, static order) on
arithmetic prompts, each agent's update inside its KL trust region, with the
held-out team accuracy (avg@K on a fixed set of test problems) before
training and after every stage. `arg` is "key=value,..." over method,
stages, seed, or "smoke" (a tiny run for tests).
"""

from sat_jax import config as config_lib


def _parse(arg: str | None) -> dict[str, str]:
  out = {}
  for item in filter(None, (arg or "").split(",")):
    key, _, value = item.partition("=")
    out[key.strip()] = value.strip() or "1"
  return out


def get_config(arg: str | None = None):
  """The demo's ConfigDict (every field overridable on the command line)."""
  args = _parse(arg)
  unknown = set(args) - {"method", "stages", "seed", "smoke"}
  if unknown:
    raise ValueError(f"demo arg: unknown key(s) {sorted(unknown)}")
  num_agents = 3
  defaults = config_lib.TrainConfig(
      team=tuple(
          config_lib.AgentEntry(name=f"agent{j}") for j in range(num_agents)
      )
  )
  c = config_lib.to_config_dict(defaults)
  c.name = "demo"
  c.seed = int(args.get("seed", 0))
  c.num_stages = int(args.get("stages", 16))
  c.time_budget_s = 0.0  # e.g. 900: stop after the stage that passes it

  c.task.name = "arithmetic"
  c.task.kwargs = dict(digits=2, train_size=2000, test_size=200)

  c.protocol.protocol = "relay"
  c.protocol.router = "all"
  c.protocol.rounds = 1
  c.protocol.max_new_tokens = 32  # a 2-digit worked answer is ~21 tokens
  c.protocol.view_buckets = (64, 96, 128, 160)  # few T: few compiles
  c.protocol.min_rows = 1024  # every sampler call has all E rows

  # Many prompts, small groups: an update fitted to few prompts memorises
  # them and does not carry over to held-out problems.
  c.rollout.prompts_per_stage = 64
  c.rollout.group_size = 4
  c.rollout.temperature = 1.0

  c.sat.method = args.get("method", "sat")
  c.sat.advantage_mode = "reuse"
  c.sat.order = "static"
  c.sat.delta = 0.1  # per-state KL radius (0.99-quantile)
  c.sat.beta_init = 0.01
  c.sat.max_backtracks = 3
  c.sat.backtrack_step_scale = 0.5  # step halving: Adam ignores beta's scale
  update = c.sat.agent_update  # SATConfig.update (a ConfigDict method name)
  update.ratio_mode = "token"
  update.epochs = 2
  update.minibatches = 4
  update.optimizer.name = "adam"
  update.optimizer.learning_rate = 3e-4
  c.sat.certificate.horizon = 1  # each agent speaks once per episode

  c.eval.num_problems = 128
  c.eval.k = 2
  c.eval.batch_size = 128

  c.pretrain.model.hidden_size = 64
  c.pretrain.model.num_layers = 2
  c.pretrain.model.num_heads = 4
  c.pretrain.model.num_kv_heads = 2
  c.pretrain.model.head_dim = 16
  c.pretrain.model.mlp_dim = 256
  c.pretrain.model.max_seq_len = 256
  c.pretrain.steps = 600
  c.pretrain.batch_size = 32
  c.pretrain.learning_rate = 1e-2
  c.pretrain.wrong_prob = 0.2
  c.pretrain.eval_problems = 128

  if "smoke" in args:  # seconds, for tests: 2 stages, tiny everything
    c.name = "demo_smoke"
    c.num_stages = int(args.get("stages", 2))
    c.task.kwargs = dict(digits=1, train_size=40, test_size=8)
    c.protocol.max_new_tokens = 16
    c.protocol.view_buckets = (96,)
    c.rollout.prompts_per_stage = 2
    c.rollout.group_size = 2
    update.minibatches = 1
    c.eval.num_problems = 4
    c.eval.k = 1
    c.eval.batch_size = 4
    c.pretrain.model.hidden_size = 32
    c.pretrain.model.head_dim = 8
    c.pretrain.model.mlp_dim = 64
    c.pretrain.steps = 4
    c.pretrain.batch_size = 4
    c.pretrain.eval_problems = 4
  return c
