"""SAT on exact toy teams: the measured table behind README's toy results.

Command (writes results/toy_teams.json and results/toy_teams.md):

  .venv/bin/python experiments/toy_teams.py            # full, a few minutes
  .venv/bin/python experiments/toy_teams.py --quick    # reduced, for tests

Every run trains on sampled batches (num_groups x group_size episodes per
stage, as real training does) and measures the exact J(pi) of the team after
every stage and agent step. Sections: monotonic improvement and the episodic
certificate per game; the certificate against batch size and delta; joint
updates against SAT; `reuse` against `resample` by exact enumeration; update
orders; the violation rate against delta.
"""

import argparse
import dataclasses
import pathlib
import sys
import time

import numpy as np

_REPO = pathlib.Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:
  sys.path.insert(0, str(_REPO))

from sat_jax import io_utils  # pylint: disable=g-import-not-at-top
from sat_jax import toy  # pylint: disable=g-import-not-at-top
from sat_jax.core import certificate  # pylint: disable=g-import-not-at-top
from sat_jax.core import config as C  # pylint: disable=g-import-not-at-top
from sat_jax.toy import exact  # pylint: disable=g-import-not-at-top

GAMES = {
    "climbing": toy.climbing_game,
    "penalty": toy.penalty_game,
    "sequential_climbing": toy.sequential_climbing_game,
}
_MADE = {}


def _game(name):
  """One game object per name, so that its jitted sampler compiles once."""
  if name not in _MADE:
    _MADE[name] = GAMES[name]()
  return _MADE[name]


ORDER_TOL = 0.05  # |final J(order) - final J(static)| / (R_hi - R_lo)


def small_delta_config(game, delta=0.01, **kw) -> C.SATConfig:
  """The default toy setting: Adam lr 0.05, 4 epochs x 2 minibatches."""
  update = C.UpdateConfig(
      epochs=4,
      minibatches=2,
      optimizer=C.OptimizerConfig(
          "adamw", 0.05, weight_decay=0.0, grad_clip=None
      ),
  )
  return C.SATConfig(
      delta=delta,
      beta_init=0.01,
      update=update,
      certificate=toy.certificate_config(game),
      **kw,
  )


def _runs(game, cfg, seeds, stages, groups=8, group_size=8, init=None):
  return [
      toy.run_toy(
          game,
          cfg,
          num_stages=stages,
          seed=s,
          num_groups=groups,
          group_size=group_size,
          init_logits=init,
      )
      for s in seeds
  ]


def monotonic_and_certificate(stages, seeds):
  """Per game: P(Delta J >= 0), certificate validity / positivity / gap."""
  rows = {}
  for name in GAMES:
    game = _game(name)
    runs = _runs(game, small_delta_config(game), seeds, stages)
    imp = np.concatenate([r.improvements for r in runs])
    lb = np.concatenate([r.bounds["episodic"] for r in runs])
    disc = np.concatenate([r.bounds["discounted"] for r in runs])
    terms = {
        t: float(
            np.median(np.concatenate([r.terms["episodic"][t] for r in runs]))
        )
        for t in ("gain", "shift", "bias", "finite_sample")
    }
    active = np.abs(imp) > 1e-9
    steps = [s for r in runs for rec in r.records for s in rec.steps]
    eta = C.CertificateConfig().dkw_eta
    kl_hat = [
        s["kl_quantile"]
        + np.sqrt(np.log(2 / eta) / (2 * s["num_own_episodes"]))
        for s in steps
    ]
    sup_kl = [k for r in runs for ks in r.sup_kl for k in ks]
    acc = np.array([s["accepted"] for s in steps])
    rows[name] = {
        "stages": int(imp.size),
        "monotone_rate": float(np.mean(imp >= 0)),
        "monotone_rate_active": float(np.mean(imp[active] >= 0)),
        "active_stages": int(active.sum()),
        "min_improvement": float(imp.min()),
        "final_J_mean": float(np.mean([r.returns[-1] for r in runs])),
        "initial_J": float(runs[0].returns[0]),
        "cert_valid_rate": float(np.mean(lb <= imp)),
        "cert_positive_rate": float(np.mean(lb > 0)),
        "cert_median_gap": float(np.median(imp - lb)),
        "cert_median_lower_bound": float(np.median(lb)),
        "discounted_median_lower_bound": float(np.median(disc)),
        "median_terms": terms,
        "dominant_penalty": max(
            ("shift", "bias", "finite_sample"), key=lambda t: terms[t]
        ),
        "accept_rate": float(acc.mean()),
        "mean_tries": float(np.mean([s["tries"] for s in steps])),
        "max_beta": float(max(s["beta"] for s in steps)),
        "delta_hat_covers_sup_kl": float(
            np.mean([h >= k for h, k, a in zip(kl_hat, sup_kl, acc) if a])
        ),
    }
  return rows


def _positive_at(
    terms, n_agents, size, a_max, eps=0.2, delta_conf=0.05, eta=0.05
):
  """Episodes per stage at which the median bound would turn positive.

  Holds the measured median gain and KL quantile fixed and scales the two
  N-dependent terms of the episodic bound of a one-state matrix game:
  finite sample ~ 1/sqrt(N) and the DKW slack inside the shift.
  """
  dkw = lambda n: np.sqrt(np.log(2 / eta) / (2 * n))
  q_sum = terms["shift"] / (a_max * certificate.KAPPA) - n_agents * dkw(size)

  def bound(n):
    fs = (
        n_agents
        * (1 + eps)
        * a_max
        * np.sqrt(np.log(2 * n_agents / delta_conf) / (2 * n))
    )
    shift = a_max * certificate.KAPPA * (q_sum + n_agents * dkw(n))
    return terms["gain"] - terms["bias"] - fs - shift

  if bound(1e12) <= 0:
    return None
  lo, hi = float(size), 1e12
  for _ in range(200):
    mid = np.sqrt(lo * hi)
    lo, hi = (mid, hi) if bound(mid) <= 0 else (lo, mid)
  return float(hi)


def certificate_vs_batch(
    seeds, stages, sizes=(64, 1024, 8192, 32768), deltas=(0.01, 0.05)
):
  """Where the episodic bound becomes positive (climbing game, early stages)."""
  game = _game("climbing")
  a_max = 0.5 * (game.reward_bounds[1] - game.reward_bounds[0])
  rows = []
  for delta in deltas:
    for size in sizes:
      runs = _runs(
          game, small_delta_config(game, delta), seeds, stages, groups=size // 8
      )
      imp = np.concatenate([r.improvements for r in runs])
      lb = np.concatenate([r.bounds["episodic"] for r in runs])
      terms = {
          t: float(
              np.median(np.concatenate([r.terms["episodic"][t] for r in runs]))
          )
          for t in ("gain", "shift", "bias", "finite_sample")
      }
      rows.append({
          "delta": delta,
          "episodes": size,
          "stages": int(imp.size),
          "valid_rate": float(np.mean(lb <= imp)),
          "positive_rate": float(np.mean(lb > 0)),
          "median_improvement": float(np.median(imp)),
          "median_lower_bound": float(np.median(lb)),
          "median_terms": terms,
          "projected_positive_at_episodes": _positive_at(
              terms, len(game.agents), size, a_max
          ),
      })
  return rows


def joint_vs_sat(seeds, stages):
  """Large steps on an anti-coordinated 2x2 coordination game."""
  game = toy.coordination_game(2)
  logits = np.log([[0.8, 0.2]])
  init = (logits, logits[:, ::-1])
  update = C.UpdateConfig(
      epsilon=0.9,
      epsilon_high=4.0,
      epochs=8,
      optimizer=C.OptimizerConfig("adam", 0.5, grad_clip=None),
  )
  out = {
      "setting": (
          "coordination2, init p(A)=(0.8, 0.2), eps=0.9, "
          "eps_high=4, delta=1, Adam lr 0.5, 8 epochs, E=64"
      )
  }
  for label, method, mode in [
      ("joint", "joint", "reuse"),
      ("sat_reuse", "sat", "reuse"),
      ("sat_resample", "sat", "resample"),
  ]:
    cfg = C.SATConfig(
        method=method,
        advantage_mode=mode,
        delta=1.0,
        beta_init=0.0,
        max_backtracks=3,
        backtrack_step_scale=0.5,
        update=update,
        certificate=toy.certificate_config(game),
    )
    runs = _runs(game, cfg, seeds, stages, init=init)
    curves = np.array([r.returns for r in runs])
    out[label] = {
        "mean_J_per_stage": curves.mean(0).round(4).tolist(),
        "seed0_J_per_stage": curves[0].round(4).tolist(),
        "decrease_rate": float(np.mean(np.diff(curves, axis=1) < 0)),
        "min_J": float(curves.min()),
    }
  return out


def reuse_vs_resample(deltas=(0.1, 0.03, 0.01, 0.003, 0.001), group_size=4):
  """Exact expected surrogates of agent 2's step under both modes."""
  game = toy.climbing_game()
  rng = np.random.default_rng(0)
  logits = [0.5 * rng.normal(size=(1, 3)), 0.5 * rng.normal(size=(1, 3))]
  rows = [exact.reuse_vs_resample(game, logits, d, group_size) for d in deltas]
  for row in rows:
    row["relative_gap"] = abs(row["gap"]) / abs(row["resample"])
  return rows


def orders(seeds, stages):
  """Final exact J after `stages` stages for each update order."""
  rows = {}
  for name in GAMES:
    game = _game(name)
    span = game.reward_bounds[1] - game.reward_bounds[0]
    finals = {}
    for order in ("static", "reverse", "random", "greedy"):
      runs = _runs(game, small_delta_config(game, order=order), seeds, stages)
      finals[order] = [float(r.returns[-1]) for r in runs]
    ref = finals["static"]
    se = lambda v: np.std(v, ddof=1) / np.sqrt(len(v))
    diffs = {
        o: {
            "diff": float(abs(np.mean(v) - np.mean(ref))),
            # 0.05 x range, plus two standard errors of the difference of
            # the seed means (which equilibrium a seed reaches is random).
            "tolerance": float(
                ORDER_TOL * span + 2 * np.sqrt(se(v) ** 2 + se(ref) ** 2)
            ),
        }
        for o, v in finals.items()
    }
    rows[name] = {
        "final_J": {
            o: {
                "mean": float(np.mean(v)),
                "std": float(np.std(v)),
                "per_seed": v,
            }
            for o, v in finals.items()
        },
        "vs_static": diffs,
        "max_diff_vs_static": max(d["diff"] for d in diffs.values()),
        "within_tolerance": all(
            d["diff"] <= d["tolerance"] for d in diffs.values()
        ),
    }
  return rows


def _fit_sqrt(x, y):
  """Least squares y = a sqrt(x); R^2 against the mean (None if y is flat)."""
  x, y = np.asarray(x), np.asarray(y)
  a = float(np.sum(np.sqrt(x) * y) / np.sum(x))
  resid = y - a * np.sqrt(x)
  total = float(np.sum((y - y.mean()) ** 2))
  r2 = 1 - float(np.sum(resid**2)) / total if total > 0 else None
  return a, r2


def violation_sweep(
    seeds,
    stages,
    settings=((0.05, 1.0), (0.3, 1.0), (0.3, 0.5)),
    deltas=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1),
):
  """State violation rate (first try) and J-decrease rate against delta.

  settings: (Adam learning rate, backtrack step scale) pairs.
  """
  game = _game("sequential_climbing")
  out = {}
  for lr, scale in settings:
    rows = []
    for delta in deltas:
      cfg = small_delta_config(game, delta, backtrack_step_scale=scale)
      cfg = dataclasses.replace(
          cfg,
          update=dataclasses.replace(
              cfg.update,
              optimizer=dataclasses.replace(
                  cfg.update.optimizer, learning_rate=lr
              ),
          ),
      )
      runs = _runs(game, cfg, seeds, stages)
      steps = [s for r in runs for rec in r.records for s in rec.steps]
      imp = np.concatenate([r.improvements for r in runs])
      rows.append({
          "delta": delta,
          "state_violation_rate": float(
              np.mean([s["first_violation_rate"] for s in steps])
          ),
          "reject_rate": float(np.mean([not s["accepted"] for s in steps])),
          "decrease_rate": float(np.mean(imp < 0)),
          "max_beta": float(max(s["beta"] for s in steps)),
          "final_J_mean": float(np.mean([r.returns[-1] for r in runs])),
      })
    fits = {}
    for key in ("state_violation_rate", "decrease_rate"):
      a, r2 = _fit_sqrt([r["delta"] for r in rows], [r[key] for r in rows])
      fits[key] = {"a": a, "r2": r2}
    out[f"lr={lr}, step scale per backtrack={scale}"] = {
        "rows": rows,
        "fit_rate_eq_a_sqrt_delta": fits,
    }
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--out", default=str(_REPO / "results"))
  args = parser.parse_args(argv)
  if args.quick:
    seeds, stages, short = (0, 1), 40, 10
  else:
    seeds, stages, short = (0, 1, 2, 3, 4), 200, 20
  start = time.time()
  results = {
      "quick": args.quick,
      "seeds": list(seeds),
      "stages": stages,
      "monotonic_and_certificate": monotonic_and_certificate(stages, seeds),
      "certificate_vs_batch": certificate_vs_batch(seeds[:3], short // 2),
      "joint_vs_sat": joint_vs_sat(seeds, short // 2),
      "reuse_vs_resample": reuse_vs_resample(),
      "orders": orders(seeds, stages // 2),
      "violation_sweep": violation_sweep(seeds[:3], short * 2),
  }
  results["wall_seconds"] = time.time() - start
  out = pathlib.Path(args.out)
  name = "toy_teams_quick" if args.quick else "toy_teams"
  # A rate over an empty set (no active stage, no accepted update) is NaN;
  # it is a result, shown as "nan" in the tables, not a failed run.
  io_utils.atomic_write_json(out / f"{name}.json", results, allow_nan=True)
  io_utils.atomic_write_text(out / f"{name}.md", render_markdown(results))
  return results


def _f(x, digits=3):
  return f"{x:.{digits}g}" if isinstance(x, float) else str(x)


def render_markdown(res) -> str:
  """The tables of results/toy_teams.md."""
  n_seeds, stages = len(res["seeds"]), res["stages"]
  lines = [
      "# SAT on exact toy teams",
      "",
      (
          "Generated by"
          f" `experiments/toy_teams.py{' --quick' if res['quick'] else ''}` in"
          f" {res['wall_seconds']:.0f} s. Training on sampled batches (64"
          " episodes = 8 groups x 8 per stage unless stated); J is exact."
      ),
      "",
      (
          "## Monotonic improvement and the episodic certificate "
          f"({stages} stages x {n_seeds} seeds, delta = 0.01)"
      ),
      "",
      (
          "| game | J start -> final | P(dJ >= 0) | P(dJ >= 0), moving stages |"
          " min dJ | LB <= dJ | LB > 0 | median dJ - LB | median gain / shift /"
          " bias / finite sample | dominant | discounted LB (median) |"
      ),
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
  ]
  for name, r in res["monotonic_and_certificate"].items():
    t = r["median_terms"]
    lines.append(
        f"| {name} | {r['initial_J']:.2f} -> {r['final_J_mean']:.2f} | "
        f"{r['monotone_rate']:.3f} | {r['monotone_rate_active']:.3f} "
        f"({r['active_stages']}) | {r['min_improvement']:.2g} | "
        f"{r['cert_valid_rate']:.3f} | {r['cert_positive_rate']:.3f} | "
        f"{r['cert_median_gap']:.3g} | {t['gain']:.2g} / {t['shift']:.3g} / "
        f"{t['bias']:.2g} / {t['finite_sample']:.3g} | {r['dominant_penalty']} "
        f"| {r['discounted_median_lower_bound']:.3g} |"
    )
  lines += [
      "",
      "## Certificate against batch size (climbing, first stages)",
      "",
      (
          "| delta | episodes/stage | LB <= dJ | LB > 0 | median dJ | "
          "median LB | median gain / shift / finite sample | projected "
          "positive at (episodes) |"
      ),
      "| --- | --- | --- | --- | --- | --- | --- | --- |",
  ]
  for r in res["certificate_vs_batch"]:
    t = r["median_terms"]
    lines.append(
        f"| {r['delta']} | {r['episodes']} | {r['valid_rate']:.3f} | "
        f"{r['positive_rate']:.3f} | {r['median_improvement']:.3g} | "
        f"{r['median_lower_bound']:.3g} | {t['gain']:.3g} / {t['shift']:.3g} "
        f"/ {t['finite_sample']:.3g} | "
        f"{_f(r['projected_positive_at_episodes'])} |"
    )
  j = res["joint_vs_sat"]
  lines += [
      "",
      "## Joint updates against SAT",
      "",
      j["setting"],
      "",
      f"| method | mean J per stage ({n_seeds} seeds) | P(dJ < 0) | min J |",
      "| --- | --- | --- | --- |",
  ]
  for label in ("joint", "sat_reuse", "sat_resample"):
    r = j[label]
    curve = ", ".join(f"{x:.2f}" for x in r["mean_J_per_stage"])
    lines.append(
        f"| {label} | {curve} | {r['decrease_rate']:.3f} | {r['min_J']:.3f} |"
    )
  lines += [
      "",
      "## `reuse` against `resample` (exact enumeration, climbing, G = 4)",
      "",
      (
          "| delta | S reuse | S resample | gap | truncation "
          "bias T | abs(gap) / S resample |"
      ),
      "| --- | --- | --- | --- | --- | --- |",
  ]
  for r in res["reuse_vs_resample"]:
    lines.append(
        f"| {r['delta']} | {r['reuse']:.4g} | {r['resample']:.4g} | "
        f"{r['gap']:.3g} | {r['truncation_bias']:.3g} | "
        f"{r['relative_gap']:.3f} |"
    )
  lines += [
      "",
      (
          f"## Update orders (final J after {stages // 2} stages, mean +- "
          "std over seeds)"
      ),
      "",
      (
          f"Tolerance per order: {ORDER_TOL} x reward range + 2 standard "
          "errors of the difference of the seed means (which equilibrium a "
          "seed reaches is random)."
      ),
      "",
      (
          "| game | static | reverse | random | greedy | max diff vs static | "
          "its tolerance | all within |"
      ),
      "| --- | --- | --- | --- | --- | --- | --- | --- |",
  ]
  for name, r in res["orders"].items():
    f = r["final_J"]
    cells = " | ".join(
        f"{f[o]['mean']:.3f} +- {f[o]['std']:.3f}"
        for o in ("static", "reverse", "random", "greedy")
    )
    worst = max(r["vs_static"].values(), key=lambda d: d["diff"])
    lines.append(
        f"| {name} | {cells} | {worst['diff']:.3f} | "
        f"{worst['tolerance']:.2f} | {r['within_tolerance']} |"
    )
  lines += ["", "## Violation rate against delta (sequential_climbing)", ""]
  for label, v in res["violation_sweep"].items():
    lines += [
        f"Adam {label}:",
        "",
        (
            "| delta | state violation rate (first try) | reject rate | "
            "P(dJ < 0) | max beta | final J |"
        ),
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in v["rows"]:
      lines.append(
          f"| {r['delta']} | {r['state_violation_rate']:.3f} | "
          f"{r['reject_rate']:.3f} | {r['decrease_rate']:.3f} | "
          f"{r['max_beta']:.3g} | {r['final_J_mean']:.2f} |"
      )
    fits = v["fit_rate_eq_a_sqrt_delta"]
    lines += [
        "",
        "Fit rate = a * sqrt(delta): "
        + "; ".join(
            f"{k}: a = {x['a']:.3g}, R^2 = {_f(x['r2'])}"
            for k, x in fits.items()
        ),
        "",
    ]
  return "\n".join(lines)


if __name__ == "__main__":
  main()
