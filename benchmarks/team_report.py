"""Markdown tables of bench_team.py's results (the "LM teams" section body)."""

from typing import Any

TARGET_X = 3.0  # sat_jax GRPO step >= 3x faster than TRL's (the issue's)
SAT_PATHS = ("team", "team_2dev", "direct")  # sat_jax's rollout paths

INTRO = (
    "`benchmarks/bench_team.py` (workers: `team_workers.py`, `team_grpo.py`,"
    " `team_stages.py`; shared inputs: `team_assets.py`), each measurement"
    " in a fresh process pinned to the same 2 CPUs, every one (TRL's too)"
    " started with `sat_jax.host_memory.reuse_freed_pages()` as the"
    " `sat-jax` command is (glibc malloc keeps freed pages for reuse; see"
    " Host memory below; `SAT_JAX_MALLOC=system` turns it off)."
    " **GRPO step**: bench-tiny"
    " (the foundation benchmark's weights, seed 0, sha256 checked) with a"
    " 4096-id BPE saved beside them; both sides load that folder. 8 fixed"
    " prompts (`Compute a+b.`, one user turn, 14 tokens) x 4 generations,"
    " exactly 64 new tokens at temperature 1 without top-k/top-p (TRL:"
    " `generation_kwargs={'min_new_tokens': 64}`, `max_completion_length=64`;"
    " sat_jax: no stop ids), reward = fraction of vowels in the completion"
    " text (same function both sides), group z-score advantages, token-ratio"
    " clip 0.2, AdamW lr 1e-6 (betas 0.9/0.999, eps 1e-8, no weight decay,"
    " clip norm 1), beta 0 (no reference model), float32, one optimizer step"
    " per 32 completions (TRL: `per_device_train_batch_size=32`,"
    " `num_generations=4`, `gradient_accumulation_steps=1`,"
    " `num_iterations=1`, `bf16=False`, `gradient_checkpointing=False`,"
    " `torch.set_num_threads(2)`; sat_jax: `run_stage` with method `single`,"
    " epochs = minibatches = 1, `max_backtracks=0` (the core refuses"
    " backtracking with one inner step), beta_init 0 (no KL term compiled),"
    " delta = inf (no trust region: the KL monitor is skipped), no"
    " certificate, so no pass over the new params after the step). A step"
    " is the wall time between two optimizer-step ends; the median over steps"
    " 2 on. sat_jax `team` = `sat_jax.team.make_rollout_fn` (rendering,"
    " streams, decoding, verifier; stop ids removed from the sampling"
    " options); `team_2dev` = the same with the sampler on a mesh of its"
    " own over two XLA CPU devices (`make_rollout_fn(sampling_mesh=...)`:"
    " a 16-row decode stream per core, parameters copied there each"
    " rollout; the process has `jax_num_cpu_devices=2`, and the update"
    " stays on device 0); `direct` = `render_chat` + `sampling.sample` +"
    " `TeamBatch.from_shared`; all give 32 x 80 views. **Phases** (measured"
    " by wrapping the stage loop's jitted calls, each blocked on): rollout;"
    " update = first try of `objective.update_agent` (its optax steps, the"
    " in-jit KL monitor when there is a trust region, and the new params'"
    " log-ratios when a certificate or a later agent reads them: not in"
    " this `single` step); backtracks = its retries; scoring ="
    " `sequence_logratio` (after a rejection only; + greedy grad norms);"
    " other = the rest of"
    " `run_stage` (advantages, certificate, checks). The machine is shared:"
    " treat every number as preliminary until rerun on a quiet machine."
)


def _f(x, spec=".2f") -> str:
  return "n/a" if x is None else format(x, spec)


def _meta(part: dict) -> list[str]:
  m = part.get("meta", {})
  return [
      (
          f"Command: `{m.get('command', '?')}` ({m.get('date', '?')},"
          f" {m.get('machine', '?')}, load average"
          f" {_f(m.get('load_avg_start'), '.1f')} ->"
          f" {_f(m.get('load_avg_end'), '.1f')})"
      ),
      "",
  ]


def _loads(rows: list[dict[str, Any]]) -> str:
  """Load average at the start and end of each round's worker."""
  return " / ".join(
      ", ".join(_f(x, ".1f") for x in r.get("load_avg", ())) or "n/a"
      for r in rows
  )


def _joined(rows: list[dict[str, Any]], key: str, spec: str = ".2f") -> str:
  return " / ".join(_f(r.get(key), spec) for r in rows) or "n/a"


def grpo_md(g: dict[str, Any]) -> list[str]:
  lines = ["### GRPO step: sat_jax `single` vs TRL `GRPOTrainer`", ""]
  lines += _meta(g)
  roofline = [r.get("flop_per_s") for r in g.get("roofline", [])]
  if roofline:
    gflops = " / ".join(_f(x and x / 1e9, ".0f") for x in roofline)
    lines += [
        (
            "Roofline (jitted 2048x2048 float32 matmul, median, before / after"
            f" the rounds): {gflops} GFLOP/s."
        ),
        "",
    ]
  med = g.get("pooled_median_s", {})
  rounds = g.get("rounds", [])
  trl = [r["trl"] for r in rounds]
  sats = [r["sat_jax"] for r in rounds]
  lines += [
      (
          "| side | rollout | median s/step | step 1 s | CPU s/step | load"
          f" (start, end) | x TRL (target >= {TARGET_X:g}) |"
      ),
      "| --- | --- | ---: | ---: | ---: | --- | ---: |",
      (
          f"| TRL {trl[0].get('trl_version', '') if trl else ''} | transformers"
          f" generate | {_f(med.get('trl'))} | {_joined(trl, 'first_s', '.1f')}"
          f" | {_joined(trl, 'median_cpu_s')} | {_loads(trl)} | 1 |"
      ),
  ]
  for path in SAT_PATHS:
    rows = [s.get(path, {}) for s in sats]
    lines.append(
        f"| sat_jax | {path} | {_f(med.get(path))} |"
        f" {_joined(rows, 'first_s', '.1f')} |"
        f" {_joined(rows, 'median_cpu_s')} | {_loads(sats)} |"
        f" **{_f(g.get(f'x_{path}'))}** |"
    )
  per_round = "; ".join(
      f"round {i + 1}: "
      + ", ".join(f"{p} {_f(r.get(f'x_{p}'))}x" for p in SAT_PATHS)
      for i, r in enumerate(rounds)
  )
  lines += [
      "",
      (
          "Median s/step pools steps 2+ of every round (the sides alternate"
          " round by round); step 1, CPU s (process CPU time per step, all"
          f" threads) and load per round. Per round: {per_round}. Under load"
          " torch's OpenMP threads slow down far more than XLA's, so only a"
          " quiet machine gives the ratio."
      ),
      "",
      "sat_jax step phases (median s, steps 2+, last round):",
      "",
      (
          "| rollout path | rollout | update_agent | sequence_logratio | other"
          " | recomputed - behaviour log-prob (max abs) |"
      ),
      "| --- | ---: | ---: | ---: | ---: | ---: |",
  ]
  sat = sats[-1] if sats else {}
  for path in SAT_PATHS:
    p = sat.get(path, {})
    lines.append(
        f"| {path} | {_f(p.get('median_rollout_s'))} |"
        f" {_f(p.get('median_update_s'))} | {_f(p.get('median_scoring_s'))} |"
        f" {_f(p.get('median_other_s'), '.3f')} |"
        f" {_f(p.get('logp_max_abs_diff'), '.1e')} |"
    )
  lean = sat.get("lean_update", {})
  trl_last = trl[-1] if trl else {}
  lines += [
      "",
      (
          "Update profile on one 32 x 80 batch (median of repeated jitted"
          f" calls): core `update_agent` {_f(lean.get('core_update_agent'))} s"
          " as the step runs it (no KL term, no monitor),"
          f" {_f(lean.get('core_update_agent_monitored'))} s with the KL"
          " monitor of a finite trust region;"
          " a lean GRPO update without any KL term (same surrogate, one AdamW"
          f" step, written in the benchmark) {_f(lean.get('lean_update'))} s;"
          f" `token_logprobs` {_f(lean.get('token_logprobs'))} s; `state_kl`"
          f" {_f(lean.get('state_kl'))} s. TRL completions: length"
          f" {_f(trl_last.get('completion_min_length'), '.0f')} to"
          f" {_f(trl_last.get('completion_max_length'), '.0f')}. Weights"
          " identical to bench_foundation.py's:"
          f" {g.get('assets', {}).get('foundation_weights_identical', 'n/a')}."
      ),
      "",
  ]
  bound = g.get("step_bound")
  if bound:
    pct = lambda x: _f(x and 100 * x, ".0f")
    sides = ", ".join(
        f"{p} {pct(bound.get(f'{p}_roofline'))}%" for p in SAT_PATHS
    )
    lines += [
        (
            "The step at the roofline: useful FLOPs per step (the same work on"
            f" both sides) rollout {bound['rollout'] / 1e9:.1f} + update"
            f" {bound['update'] / 1e9:.1f} GFLOP (backward = 2 x forward) ="
            f" {bound['step'] / 1e9:.1f} GFLOP, i.e."
            f" {bound['floor_s']:.3f} s at the faster roofline reading"
            f" ({bound['peak_flop_per_s'] / 1e9:.0f} GFLOP/s): at most"
            f" **{bound['max_x_trl']:.2f}x** TRL's median step on this host."
            f" The {TARGET_X:g}x target needs the whole step at"
            f" **{pct(bound['target_roofline'])}%** of the roofline; measured:"
            f" TRL {pct(bound.get('trl_roofline'))}%, sat_jax {sides}."
        ),
        "",
    ]
  direct = sat.get("direct", {})
  step, trl_s = direct.get("median_s"), med.get("trl")
  rollout, update = (direct.get(f"median_{k}_s") for k in ("rollout", "update"))
  if step and trl_s and rollout and update:
    lines += [
        (
            "Where the direct step goes: update_agent"
            f" {100 * update / step:.0f}%, the sampler rollout"
            f" {100 * rollout / step:.0f}%."
        ),
        "",
    ]
  return lines


_STAGE_COLS = (
    "stage_s", "rollout_s", "update_s", "backtracks_s", "scoring_s",
    "other_s", "eval_s", "period_s",
)  # fmt: skip


def demo_md(d: dict[str, Any]) -> list[str]:
  lines = ["### Demo stages (`experiments/demo.py`)", ""]
  lines += _meta(d)
  c = d.get("config", {})
  lines += [
      (
          f"{c.get('agents')} agents, {c.get('protocol')},"
          f" {c.get('advantage_mode')}, {c.get('episodes_per_stage')} episodes"
          f" per stage, up to {c.get('max_new_tokens')} new tokens per message,"
          f" {c.get('epochs')} epochs x {c.get('minibatches')} minibatches, up"
          f" to {c.get('max_backtracks')} backtracks; held-out eval of"
          f" {c.get('eval_problems')} problems x K={c.get('eval_k')} after each"
          " stage. Seconds; run_stage = rollout + update + backtracks +"
          " scoring + other; period = one stage start to the next (eval,"
          " metrics, plot and checkpoint included); traces = jitted functions"
          " traced in the stage (> 0: it compiled)."
      ),
      "",
      (
          "| stage | run_stage | rollout (render / sample / decode) | update |"
          " backtracks | scoring | other | eval | period | tries per agent |"
          " traces | view T per agent |"
      ),
      (
          "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---"
          " | ---: | --- |"
      ),
  ]
  for i, s in enumerate(d.get("stages", [])):
    lines.append(
        f"| {i + 1} | {_f(s['stage_s'])} | {_f(s['rollout_s'])}"
        f" ({_f(s.get('render_s'))} / {_f(s.get('sample_s'))} /"
        f" {_f(s.get('decode_s'))}) | {_f(s['update_s'])} |"
        f" {_f(s['backtracks_s'])} | {_f(s['scoring_s'])} |"
        f" {_f(s['other_s'])} | {_f(s.get('eval_s'))} |"
        f" {_f(s.get('period_s'))} | {s['tries']} | {s.get('traces')} |"
        f" {s.get('view_lengths')} |"
    )
  m = d.get("summary", {})
  acc = d.get("accuracy") or {}
  lines += [
      "",
      f"Median over stages 2+ ({m.get('measured_stages')} stages):"
      + "".join(f" {k[:-2]} {_f(m.get(k))} s," for k in _STAGE_COLS)
      + f" {_f(m.get('tries_mean'))} tries per agent step;"
      f" **{_f(m.get('episodes_per_s'), '.1f')} episodes/s** of run_stage"
      f" ({_f(m.get('episodes'), '.0f')} episodes per stage). Held-out team"
      " accuracy by stage: "
      + ", ".join(f"{k}: {_f(v, '.3f')}" for k, v in acc.items())
      + ".",
      "",
  ]
  return lines


def scaling_md(sc: dict[str, Any]) -> list[str]:
  lines = ["### Scaling in the number of agents", ""]
  lines += _meta(sc)
  lines += [
      (
          "The demo config with n agents (all from the demo's base; relay, 1"
          " round, so rollout work grows with n), no held-out eval; views"
          " padded to multiples of 32. Median seconds per `run_stage` over the"
          " stages after warm-up. An agent's update and scoring cost in"
          " proportion to its view length T, which in a relay grows with the"
          " agent's position, so a stage's cost follows the summed view"
          " length rather than n; `reuse` takes one rollout per stage,"
          " `resample` n (each of them n turns long)."
      ),
      "",
      (
          "| n | mode | s/stage | s/stage without backtracks |"
          " rollouts/stage | rollout | update | backtracks | scoring | other |"
          " tries per agent step | episodes/s | compiles in measured stages |"
          " view T per agent |"
      ),
      (
          "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---:"
          " | ---: | ---: | ---: | --- |"
      ),
  ]
  for r in sc.get("rows", []):
    lines.append(
        f"| {r['agents']} | {r['mode']} | {_f(r['stage_s'])} |"
        f" {_f(r.get('no_backtracks_s'))} |"
        f" {_f(r['rollout_calls'], '.0f')} | {_f(r['rollout_s'])} |"
        f" {_f(r['update_s'])} | {_f(r['backtracks_s'])} |"
        f" {_f(r['scoring_s'])} | {_f(r['other_s'])} |"
        f" {_f(r['tries_mean'])} | {_f(r['episodes_per_s'], '.1f')} |"
        f" {r.get('traces_measured')} | {r.get('view_lengths', 'n/a')} |"
    )
  fits = sc.get("fits", {})
  lines += [
      "",
      "Least-squares lines of seconds per stage against n, and against sum"
      " T, the summed view length of the n agents (in a relay agent j's view"
      " holds the j messages before its own, so sum T grows faster than n;"
      " `no backtracks` = the stage minus its retries, i.e. the cost had"
      " every first try been accepted): "
      + "; ".join(
          f"{mode} {key.replace('_vs_sum_T', '').replace('_', ' ')}:"
          f" {_f(f['slope'], '.4g')} {'sum T' if 'sum_T' in key else 'n'} +"
          f" {_f(f['intercept'])} (R^2 {_f(f['r2'], '.3f')})"
          for mode, by_key in fits.items()
          for key, f in by_key.items()
      )
      + ".",
      "",
  ]
  return lines


def markdown(results: dict[str, Any]) -> str:
  """The whole section body, one block per part that has results."""
  lines = [INTRO, ""]
  for part, render in (
      ("grpo", grpo_md),
      ("demo", demo_md),
      ("scaling", scaling_md),
  ):
    value = results.get(part)
    if not value:
      continue
    if "error" in value:
      lines += [f"### {part}", "", f"Failed: `{value['error'][:300]}`", ""]
      continue
    lines += render(value)
  return "\n".join(lines)
