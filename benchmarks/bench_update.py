"""The core's LM update: the output head at the agent's own tokens, the KL's
old side once per try, against the full-view pass of the previous version.

    .venv/bin/python benchmarks/bench_update.py [--repeats 7]

Times one jitted `objective.update_agent` try (as the stage loop runs it:
the clipped surrogate with the beta-weighted exact KL, epochs x
minibatches of AdamW, then the KL monitor's pass) on a view of E episodes x
T tokens of which the last `own` per row are the agent's (a relay agent's
view holds the other agents' messages too). Three variants, compiled in
this process and timed interleaved (medians), so machine load moves them
alike:

  full view     no positions: the head and the KL's two softmaxes run at
                every position, and params_old's body runs in every step
                (what update_agent did before `positions_ExA` and
                `kl_reference`);
  own tokens    the head at the own positions only, the old body per step;
  + reference   and the old side's hidden states computed once per try.

Workloads: bench-tiny (Qwen3 layout, V = 4096) and the same body with
Qwen3's vocabulary (V = 151936, "bench-tiny-v151936"), where the head is
most of the work; and "grpo", the update of bench_team.py's GRPO step
(bench-tiny, 32 x 80 with 64 completion tokens, one AdamW step, no KL term
and no monitor, so "+ reference" changes nothing there). Prints a markdown
table and the largest parameter difference to the full-view update
relative to the largest parameter change.
"""

import argparse
import dataclasses
import functools
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from sat_jax import host_memory  # pylint: disable=g-import-not-at-top
from sat_jax import scoring  # pylint: disable=g-import-not-at-top
from sat_jax.core import agent as agent_lib  # pylint: disable=g-import-not-at-top
from sat_jax.core import batch as batch_lib  # pylint: disable=g-import-not-at-top
from sat_jax.core import config as core_config  # pylint: disable=g-import-not-at-top
from sat_jax.core import objective  # pylint: disable=g-import-not-at-top
from sat_jax.models import presets  # pylint: disable=g-import-not-at-top
from sat_jax.models import transformer  # pylint: disable=g-import-not-at-top
from sat_jax.team import lm_agent  # pylint: disable=g-import-not-at-top

QWEN3_VOCAB = 151936
# name -> (preset, vocab, E, T, own tokens per row, with the KL)
WORKLOADS = {
    "bench-tiny": ("qwen3-bench-small", None, 32, 80, 32, True),
    "bench-tiny-v151936": ("qwen3-bench-small", QWEN3_VOCAB, 8, 128, 32, True),
    "grpo": ("qwen3-bench-small", None, 32, 80, 64, False),
}


@dataclasses.dataclass(frozen=True)
class PassPerStep(lm_agent.LMAgent):
  """The LM agent without `kl_reference`: the old body in every step."""

  kl_reference = None


def _view(config, e, t, own, key):
  tokens = jax.random.randint(key, (e, t), 1, config.vocab_size)
  mask = jnp.ones_like(tokens)
  own_ExT = np.zeros((e, t), bool)
  own_ExT[:, t - own :] = True
  inputs = {"tokens_ExT": tokens, "mask_ExT": mask}
  positions = scoring.action_positions(own_ExT)
  return inputs, own_ExT, positions


def interleaved_median_ms(calls, repeats: int) -> dict[str, float]:
  """Median ms of each `calls[k]()` (blocked on), called in turn `repeats` x.

  Alternating the calls lets machine load move them alike.
  """
  times = {k: [] for k in calls}
  for _ in range(repeats):
    for k, f in calls.items():
      start = time.perf_counter()
      jax.block_until_ready(f())
      times[k].append(time.perf_counter() - start)
  return {k: 1e3 * statistics.median(v) for k, v in times.items()}


def run(name, ns):
  preset, vocab, e, t, own, with_kl = WORKLOADS[name]
  config = presets.get_preset(preset)
  if vocab:
    config = config.replace(vocab_size=vocab)
  params = transformer.init_params(config, jax.random.key(0))
  inputs, own_ExT, positions = _view(config, e, t, own, jax.random.key(1))
  agent = lm_agent.LMAgent(config, 1.0)
  behaviour = jax.jit(agent.token_logprobs)(params, inputs)

  def view(with_positions):
    extra = {"positions_ExA": jnp.asarray(positions)} if with_positions else {}
    return batch_lib.AgentView(
        inputs=dict(inputs, **extra),
        mask_ExT=jnp.asarray(own_ExT),
        behaviour_logp_ExT=behaviour,
    )

  cfg = core_config.UpdateConfig(
      ratio_mode="seq" if with_kl else "token",
      epochs=ns.epochs if with_kl else 1,
      minibatches=ns.minibatches if with_kl else 1,
      optimizer=core_config.OptimizerConfig(learning_rate=1e-4),
  )
  switches = dict(kl_penalty=with_kl, monitor=with_kl, measure_new=with_kl)
  tx = agent_lib.make_optimizer(cfg.optimizer)
  opt_state = tx.init(params)
  adv_E = jax.random.normal(jax.random.key(2), (e,))
  variants = {
      "full view": (PassPerStep(config, 1.0), view(False)),
      "own tokens": (PassPerStep(config, 1.0), view(True)),
      "+ reference": (agent, view(True)),
  }
  calls = {}
  for label, (a, v) in variants.items():
    fn = jax.jit(functools.partial(objective.update_agent, a, cfg, **switches))
    args = (
        params, opt_state, params, jnp.float32(0.1), jnp.float32(1.0),
        jnp.float32(0.05), v, adv_E, jnp.ones(e), jax.random.key(3),
    )  # fmt: skip
    calls[label] = functools.partial(fn, *args)
  new = {k: jax.block_until_ready(f()[0]) for k, f in calls.items()}
  step = max(
      float(jnp.max(jnp.abs(a - b)))
      for a, b in zip(
          jax.tree.leaves(new["full view"]), jax.tree.leaves(params)
      )
  )
  diff = max(
      max(
          float(jnp.max(jnp.abs(a - b)))
          for a, b in zip(
              jax.tree.leaves(new[k]), jax.tree.leaves(new["full view"])
          )
      )
      for k in calls
  )
  ms = interleaved_median_ms(calls, ns.repeats)
  base = ms["full view"]
  print(
      f"| {name} | {e} x {t}, own {own} (A = {positions.shape[1]}) |"
      f" {cfg.epochs} x {cfg.minibatches}{', KL' if with_kl else ''} |"
      + "".join(f" {ms[k]:.0f} |" for k in calls)
      + f" {base / ms['own tokens']:.2f}x | {base / ms['+ reference']:.2f}x |"
      + f" {diff / step:.1e} |",
      flush=True,
  )


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--epochs", type=int, default=2)
  parser.add_argument("--minibatches", type=int, default=4)
  parser.add_argument("--workloads", default=",".join(WORKLOADS))
  ns = parser.parse_args()
  host_memory.reuse_freed_pages()
  print(
      "update_agent, float32 (KL: the beta-weighted KL penalty and the"
      f" monitor's pass); median ms of {ns.repeats} interleaved calls\n"
  )
  print(
      "| model | view | epochs x minibatches | full view ms | own tokens ms |"
      " + reference ms | speedup (own) | speedup (both) | max param diff /"
      " max change |"
  )
  print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
  for name in ns.workloads.split(","):
    run(name, ns)


if __name__ == "__main__":
  main()
