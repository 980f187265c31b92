"""The evaluation loop: K team samples per problem, scored, summarised, saved.

`evaluate` is generic over a generation callable, so any team rollout plugs
in: `generate_fn(examples, k, key)` returns, per example, k `TeamSample`s
(or plain strings: the team answer text). The team answer is whatever the
rollout's protocol produced (relay: the last message; vote: the voted answer;
solo: one agent's answer); multi-turn rollouts pass the environment's verdict
in `TeamSample.verdict`, which is then used as is. Every other sample is
scored with `base.score_text` (a verifier exception is a wrong sample whose
reason is logged, never a crash).

A task may define `extra_scores(example, verdict) -> {name: float}` (e.g. the
zebra tasks' cell accuracy); those are averaged like avg@K.

Outputs in `out_dir` (all written atomically): predictions.jsonl (one row per
sample), summary.json, summary.md (a markdown table); by process 0 only
when the run spans several processes.
"""

import dataclasses
import json
import pathlib
import time
from typing import Any, Callable, Hashable, Mapping, Sequence

from absl import logging
import jax
import numpy as np
import tqdm

from sat_jax import io_utils
from sat_jax import multihost
from sat_jax.eval import metrics
from sat_jax.tasks import base

# The paper's K per benchmark (PAPER.md §6.1); a task name matches its entry
# exactly or by the prefix before its first "_" (arbench_gn -> arbench).
PAPER_K: dict[str, int] = {
    "aime24": 64,
    "aime25": 64,
    "zebralogic": 64,
    "arbench": 25,
    "planbench": 8,
    "autologi": 8,
    "math500": 4,
}


def default_k(task_name: str, override: int | None = None) -> int:
  """K for `task_name`: `override` if given, else the paper's table."""
  if override is not None:
    if not isinstance(override, int) or override < 1:
      raise ValueError(f"k must be an int >= 1, got {override!r}")
    return override
  for name in (task_name, task_name.split("_")[0]):
    if name in PAPER_K:
      return PAPER_K[name]
  raise ValueError(
      f"no paper K for task {task_name!r} (table: {PAPER_K}); pass k"
  )


@dataclasses.dataclass(frozen=True)
class TeamSample:
  """One team output for one problem."""

  text: str  # the team answer message (per protocol)
  agent_texts: Sequence[str] = ()  # optional: each agent's own answer
  transcript: Any = None  # optional, JSON-able: written to predictions
  verdict: base.Verdict | None = None  # set by multi-turn rollouts


GenerateFn = Callable[
    [Sequence[base.Example], int, jax.Array], Sequence[Sequence[Any]]
]


def _vote_key(task: base.Task, answer: str | None) -> Hashable | None:
  if answer is None:
    return None
  try:
    return task.answer_key(answer)
  except Exception as e:  # pylint: disable=broad-except
    logging.warning("%s: answer_key raised %r on %r", task.name, e, answer)
    return " ".join(answer.split())


def _extra(task, example, verdict) -> dict[str, float]:
  fn = getattr(task, "extra_scores", None)
  if fn is None:
    return {}
  try:
    return {k: float(v) for k, v in fn(example, verdict).items()}
  except Exception as e:  # pylint: disable=broad-except
    logging.warning("%s/%s: extra_scores raised %r", task.name, example.uid, e)
    return {}


def score_sample(
    task: base.Task, example: base.Example, sample: TeamSample | str
) -> tuple[dict[str, Any], Hashable | None]:
  """(prediction row, vote key) of one sample."""
  if isinstance(sample, str):
    sample = TeamSample(sample)
  verdict = sample.verdict
  if verdict is None:
    verdict = base.score_text(task, example, sample.text)
  agents = [base.score_text(task, example, t) for t in sample.agent_texts]
  key = _vote_key(task, verdict.answer)
  row = {
      "uid": example.uid,
      "text": sample.text,
      "answer": verdict.answer,
      "correct": bool(verdict.correct),
      "reward": float(verdict.reward),
      "reason": verdict.reason,
      "vote_key": None if key is None else repr(key),
      "extra": _extra(task, example, verdict),
      "agents": [
          {"answer": v.answer, "correct": bool(v.correct), "reason": v.reason}
          for v in agents
      ],
  }
  if sample.transcript is not None:
    try:
      json.dumps(sample.transcript)
      row["transcript"] = sample.transcript
    except (TypeError, ValueError):
      logging.warning(
          "%s: transcript is not JSON-able; saved as repr", example.uid
      )
      row["transcript"] = repr(sample.transcript)
  return row, key


def _check_batch(batch, outputs, k) -> None:
  if len(outputs) != len(batch):
    raise ValueError(
        f"generate_fn returned {len(outputs)} outputs for {len(batch)} examples"
    )
  for example, samples in zip(batch, outputs):
    if len(samples) != k:
      raise ValueError(
          f"generate_fn returned {len(samples)} samples for {example.uid},"
          f" expected k={k}"
      )


def summarise(
    name: str,
    rows_per_problem: Sequence[Sequence[dict[str, Any]]],
    keys_per_problem: Sequence[Sequence[Hashable | None]],
    k: int,
    pass_ks: Sequence[int],
) -> dict[str, Any]:
  """The metrics of scored samples (see `metrics` for the definitions)."""
  correct = [[r["correct"] for r in rows] for rows in rows_per_problem]
  summary: dict[str, Any] = {
      "task": name,
      "num_problems": len(correct),
      "k": k,
      f"avg@{k}": metrics.avg_at_k(correct),
  }
  for j in pass_ks:
    summary[f"pass@{j}"] = metrics.mean_pass_at_k(
        [len(c) for c in correct], [sum(c) for c in correct], j
    )
  summary[f"maj@{k}"] = metrics.maj_at_k(keys_per_problem, correct)
  every = [r for rows in rows_per_problem for r in rows]
  summary["mean_reward"] = float(np.mean([r["reward"] for r in every]))
  summary["no_answer_rate"] = float(
      np.mean([r["answer"] is None for r in every])
  )
  summary["verifier_errors"] = sum(
      r["reason"].startswith(("verifier error", "extractor error"))
      for r in every
  )
  extra_names = sorted({n for r in every for n in r["extra"]})
  for n in extra_names:
    summary[n] = float(
        np.mean([
            np.mean([r["extra"].get(n, 0.0) for r in rows])
            for rows in rows_per_problem
        ])
    )
  num_agents = {len(r["agents"]) for r in every}
  if num_agents != {0} and len(num_agents) == 1:
    for a in range(num_agents.pop()):
      summary[f"agent{a}/avg@{k}"] = metrics.avg_at_k([
          [r["agents"][a]["correct"] for r in rows] for rows in rows_per_problem
      ])
  return summary


def markdown_table(summaries: Sequence[Mapping[str, Any]]) -> str:
  """One row per summary: task, N, K, then every metric they report."""
  columns: list[str] = []
  for s in summaries:
    columns += [c for c in s if c not in ("task", "meta") and c not in columns]
  fmt = lambda v: f"{v:.4f}" if isinstance(v, float) else str(v)
  lines = [
      "| task | " + " | ".join(columns) + " |",
      "| --- |" + " ---: |" * len(columns),
  ]
  for s in summaries:
    cells = [fmt(s[c]) if c in s else "" for c in columns]
    lines.append(f"| {s['task']} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def evaluate(
    task: base.Task,
    examples: Sequence[base.Example],
    generate_fn: GenerateFn,
    k: int,
    key: jax.Array,
    out_dir: str | pathlib.Path,
    *,
    progress: bool = True,
    batch_size: int = 8,
    pass_ks: Sequence[int] | None = None,
    meta: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
  """Samples k team outputs per example, scores them, writes the results.

  Batch b of examples gets the key `fold_in(key, b)`. Returns the summary
  (also in out_dir/summary.json): avg@k, pass@j for j in `pass_ks` (default
  1, 2, 4, ..., k), maj@k, mean reward, no-answer rate, verifier errors,
  task extra scores, per-agent avg@k when agent answers are given.
  """
  if not examples:
    raise ValueError(f"{task.name}: no examples to evaluate")
  if not isinstance(k, int) or k < 1:
    raise ValueError(f"k must be an int >= 1, got {k!r}")
  if not isinstance(batch_size, int) or batch_size < 1:
    raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
  pass_ks = list(pass_ks or metrics.default_pass_ks(k))
  if any(not 1 <= j <= k for j in pass_ks):
    raise ValueError(f"pass_ks must lie in [1, k={k}], got {pass_ks}")
  out_dir = pathlib.Path(out_dir)
  rows_per_problem, keys_per_problem = [], []
  gen_s = score_s = 0.0
  bar = tqdm.tqdm(
      total=len(examples), desc=f"eval {task.name}", disable=not progress
  )
  for b, start in enumerate(range(0, len(examples), batch_size)):
    batch = examples[start : start + batch_size]
    t0 = time.perf_counter()
    outputs = generate_fn(batch, k, jax.random.fold_in(key, b))
    t1 = time.perf_counter()
    _check_batch(batch, outputs, k)
    for example, samples in zip(batch, outputs):
      scored = [score_sample(task, example, s) for s in samples]
      rows = [dict(row, sample=j) for j, (row, _) in enumerate(scored)]
      rows_per_problem.append(rows)
      keys_per_problem.append([key_ for _, key_ in scored])
    gen_s += t1 - t0
    score_s += time.perf_counter() - t1
    bar.update(len(batch))
  bar.close()
  summary = summarise(task.name, rows_per_problem, keys_per_problem, k, pass_ks)
  summary["generate_s"] = round(gen_s, 3)
  summary["score_s"] = round(score_s, 3)
  if meta:
    summary["meta"] = dict(meta)
  if multihost.is_primary():  # every process computed the same rows
    io_utils.atomic_write_jsonl(
        out_dir / "predictions.jsonl",
        (r for rows in rows_per_problem for r in rows),
    )
    io_utils.atomic_write_json(out_dir / "summary.json", summary)
    io_utils.atomic_write_text(
        out_dir / "summary.md", markdown_table([summary])
    )
  logging.info("%s: %s", task.name, summary)
  return summary
