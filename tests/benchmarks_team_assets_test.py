"""bench_team.py's check that its weights are bench_foundation.py's."""

import hashlib
import json
import pathlib
import sys

sys.path.insert(
    0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks")
)

import team_assets  # pylint: disable=g-import-not-at-top,wrong-import-position


def _ckpt(path: pathlib.Path, config: dict, weights: bytes) -> pathlib.Path:
  path.mkdir(parents=True)
  (path / "config.json").write_text(json.dumps(config))
  (path / "model.safetensors").write_bytes(weights)
  return path


def test_foundation_weights_identical_in_any_foundation_dir(tmp_path):
  config = {"vocab_size": 8, "hidden_size": 4}
  team_sha256 = hashlib.sha256(b"weights").hexdigest()
  foundation = tmp_path / "elsewhere"

  def same():
    return team_assets.foundation_weights_identical(
        team_sha256, foundation, config
    )

  assert same() is None  # nothing to compare with: "n/a" in the report
  _ckpt(foundation / "bench-tiny", dict(config, extra=1), b"weights")
  assert same() is True  # keys the team side does not set are not compared
  (foundation / "bench-tiny" / "model.safetensors").write_bytes(b"weightz")
  assert same() is False
  (foundation / "bench-tiny" / "model.safetensors").write_bytes(b"weights")
  (foundation / "bench-tiny" / "config.json").write_text(
      json.dumps(dict(config, hidden_size=8))
  )
  assert same() is False
