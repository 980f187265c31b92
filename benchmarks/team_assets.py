"""Shared inputs of bench_team.py: bench-tiny weights + tokenizer, bench task.

Both sides of the GRPO comparison read one folder, `<out>/bench-tiny`:

- weights: the foundation benchmark's "bench-tiny" (its `BENCH_CONFIGS`
  entry, its common HF settings, torch seed 0), written by its own
  `foundation_workers.weights`, so they are the very weights of
  bench_foundation.py (the sha256 is compared when that folder exists);
- tokenizer: a digit-splitting byte-level BPE (`sat_jax.sft.build_tokenizer`,
  ChatML template, eos <|im_end|>) trained on a fixed corpus to exactly the
  model's 4096 ids (filled up with unused special tokens if the merges run
  out), so that every id a random model samples decodes.

The bench task asks 3-digit additions (fixed prompts, one user turn of 14
tokens with the template's generation prompt) and scores a message
with `bench_reward`, a cheap deterministic function of its text that both
sides apply to their completions: the fraction of its characters that are
vowels. (A random model never answers an addition, so the arithmetic
verifier would give a constant reward and zero advantages.)
"""

import hashlib
import json
import pathlib
import random
import sys
from typing import Any, Sequence

_HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parent))
sys.path.insert(0, str(_HERE))

import bench_foundation  # pylint: disable=g-import-not-at-top,wrong-import-position
import foundation_workers  # pylint: disable=g-import-not-at-top,wrong-import-position
from sat_jax.tasks import base  # pylint: disable=g-import-not-at-top,wrong-import-position

BENCH_MODEL = "bench-tiny"
BENCH_SEED = 0  # bench_foundation.py's weight seed
_SYLLABLES = (
    "ka ri to ne mu sa lo pe di ga ve zo an el is on ur th st ch qu br pl"
    " tr gr mi ko ta ba fe ru ni so".split()
)


def sha256(path: pathlib.Path) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def corpus(num_lines: int = 6000, seed: int = 0) -> list[str]:
  """Fixed tokenizer corpus: worked additions, the prompts, pseudo-words."""
  # Imported here: it pulls in the task storage stack (tfds, grain), which
  # the TRL worker, a user of this module, has no need of.
  from sat_jax.tasks import arithmetic  # pylint: disable=g-import-not-at-top

  rng = random.Random(seed)
  lines = ["system\n", "user\n", "assistant\n"]
  for _ in range(num_lines):
    a, b = rng.randint(100, 999), rng.randint(100, 999)
    lines.append(f"user\nCompute {a}+{b}.")
    worked = arithmetic.worked_sum(a, b) + [f"Answer: {a + b}"]
    lines.append("assistant\n" + "\n".join(worked))
    words = [
        "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4)))
        for _ in range(rng.randint(4, 12))
    ]
    lines.append(" ".join(words) + rng.choice(".?!,;:"))
  return lines


def build_tokenizer(path: pathlib.Path, vocab_size: int) -> int:
  """Trains the bench BPE into `path` with exactly vocab_size ids."""
  import transformers  # pylint: disable=g-import-not-at-top

  from sat_jax import sft  # pylint: disable=g-import-not-at-top

  sft.build_tokenizer(path, corpus(), vocab_size)
  tok = transformers.AutoTokenizer.from_pretrained(
      str(path), local_files_only=True
  )
  missing = vocab_size - len(tok)
  if missing < 0:
    raise RuntimeError(f"{path}: {len(tok)} tokens > vocab {vocab_size}")
  if missing:
    tok.add_special_tokens({
        "additional_special_tokens": [f"<|unused_{i}|>" for i in range(missing)]
    })
    tok.save_pretrained(str(path))
  return len(tok)


def prepare(
    out_dir: pathlib.Path, foundation_dir: pathlib.Path
) -> dict[str, Any]:
  """Writes (once) <out_dir>/bench-tiny: weights + tokenizer; returns info.

  `foundation_dir` is bench_foundation.py's out_dir: when it holds
  bench-tiny, the info says whether the weights are the same.
  """
  ckpt = out_dir / BENCH_MODEL
  hf_config = bench_foundation._hf_config(BENCH_MODEL)  # pylint: disable=protected-access
  info = foundation_workers.weights(
      {"ckpt": str(ckpt), "hf_config": hf_config, "seed": BENCH_SEED}
  )
  vocab = hf_config["vocab_size"]
  if not (ckpt / "tokenizer.json").is_file():
    info["tokenizer_written"] = True
    build_tokenizer(ckpt, vocab)
  import transformers  # pylint: disable=g-import-not-at-top

  tok = transformers.AutoTokenizer.from_pretrained(
      str(ckpt), local_files_only=True
  )
  if len(tok) != vocab:
    raise RuntimeError(f"{ckpt}: tokenizer has {len(tok)} ids, model {vocab}")
  info.update(
      ckpt=str(ckpt),
      tokenizer_size=len(tok),
      hf_config=hf_config,
      weights_sha256=sha256(ckpt / "model.safetensors"),
  )
  same = foundation_weights_identical(
      info["weights_sha256"], foundation_dir, hf_config
  )
  if same is not None:
    info["foundation_weights_identical"] = same
  return info


def foundation_weights_identical(
    weights_sha256: str, foundation_dir: pathlib.Path, hf_config: dict
) -> bool | None:
  """Whether bench_foundation.py's bench-tiny has these weights and config.

  None when `foundation_dir` has no bench-tiny checkpoint to compare with.
  """
  foundation = foundation_dir / BENCH_MODEL
  if not (foundation / "model.safetensors").is_file():
    return None
  stored = json.loads((foundation / "config.json").read_text())
  same_config = all(stored.get(k) == v for k, v in hf_config.items())
  return same_config and (
      sha256(foundation / "model.safetensors") == weights_sha256
  )


def bench_reward(text: str) -> float:
  """Fraction of the characters of `text` that are vowels (0 if empty)."""
  return sum(c in "aeiouAEIOU" for c in text) / len(text) if text else 0.0


def bench_prompts(num: int, seed: int = 0) -> list[str]:
  """`num` fixed prompts "Compute a+b." with 3-digit a, b."""
  rng = random.Random(seed)
  return [
      f"Compute {rng.randint(100, 999)}+{rng.randint(100, 999)}." for _ in
      range(num)
  ]  # fmt: skip


def bench_messages(prompt: str) -> list[dict[str, str]]:
  """The chat both sides render: one user turn, no system prompt."""
  return [base.message("user", prompt)]


class BenchTask(base.Task):
  """The bench prompts; a message's reward is `bench_reward` of its text."""

  name = "bench_digits"
  system_prompt = None  # as bench_messages

  def __init__(self, num_prompts: int):
    self._examples = [
        base.Example(uid=f"bench-{i}", prompt=p, target="")
        for i, p in enumerate(bench_prompts(num_prompts))
    ]

  def load(self, split: str) -> Sequence[base.Example]:
    del split
    return list(self._examples)

  def extract_answer(self, text: str) -> str | None:
    return text  # the whole message is scored

  def check(self, example: base.Example, answer: str) -> base.Verdict:
    del example
    reward = bench_reward(answer)
    return base.Verdict(reward, reward > 0.5, answer)
