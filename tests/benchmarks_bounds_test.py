"""The roofline bounds the two issue benchmarks print beside their ratios."""

import pathlib
import sys

import pytest

sys.path.insert(
    0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks")
)

import bench_foundation  # pylint: disable=g-import-not-at-top,wrong-import-position
import bench_team  # pylint: disable=g-import-not-at-top,wrong-import-position

# D 4, F 6, V 10, 2 layers, 2 heads, 1 kv head, head_dim 2.
_HF = dict(vocab_size=10, hidden_size=4, num_hidden_layers=2,
           num_attention_heads=2, num_key_value_heads=1, head_dim=2,
           intermediate_size=6)  # fmt: skip


def test_grpo_step_flops_by_hand():
  # Body weights per layer: q 4x4, k and v 4x2, o 4x4, gate/up/down 4x6 each
  # = 120; two layers 240. Head D V = 40. Attention 4 L H Hd = 32 per
  # (query, key) pair. Prompts of 2 and 3 tokens, 2 new tokens: 3 and 4
  # positions through the body (6 and 10 causal pairs), the head at 2 each.
  row_1 = 2 * 240 * 3 + 2 * 40 * 2 + 32 * 6
  row_2 = 2 * 240 * 4 + 2 * 40 * 2 + 32 * 10
  flops = bench_team.grpo_step_flops(_HF, [2, 3], new_tokens=2)
  assert flops["rollout"] == row_1 + row_2 == 4192
  assert flops["update"] == 3 * 4192
  assert flops["step"] == 4 * 4192


def _grpo_results(prompt_lengths):
  return {
      "assets": {"hf_config": _HF},
      "roofline": [{"flop_per_s": 1e3}, {"flop_per_s": 4e3}],
      "rounds": [{
          "trl": {"times_s": [9.0, 2.0, 2.0]},
          "sat_jax": {
              "team": {"times_s": [9.0, 1.0, 1.0]},
              "team_2dev": {"times_s": [9.0, 0.5, 0.5]},
              "direct": {
                  "times_s": [9.0, 4.0, 4.0],
                  "prompt_tokens_per_row": prompt_lengths,
              },
          },
      }],
  }


def test_step_bound_uses_the_faster_roofline_and_the_pooled_medians():
  results = bench_team.derive({"grpo": _grpo_results([2, 3])})
  bound = results["grpo"]["step_bound"]
  step = bench_team.grpo_step_flops(_HF, [2, 3], 64)["step"]
  floor_s = step / 4e3
  assert bound["floor_s"] == pytest.approx(floor_s)
  assert bound["max_x_trl"] == pytest.approx(2.0 / floor_s)
  assert bound["target_roofline"] == pytest.approx(3.0 * floor_s / 2.0)
  assert bound["team_2dev_roofline"] == pytest.approx(floor_s / 0.5)
  assert bound["trl_roofline"] == pytest.approx(floor_s / 2.0)


def test_step_bound_is_absent_without_prompt_lengths():
  results = bench_team.derive({"grpo": _grpo_results(None)})
  assert results["grpo"]["step_bound"] is None


def test_sampler_target_roofline_is_the_target_over_the_ratio():
  med = lambda s: {"median_s": s}
  results = {
      "roofline": {"flop_per_s": 2e11},
      "runs": {
          "bench-small": {
              "float32": {
                  "sat_jax": {"sampler": med(2.0), "scoring": med(1.0)},
                  "transformers": {"sampler": med(5.0), "scoring": med(1.0)},
              }
          }
      },
  }
  d = bench_foundation.derive(results)["runs"]["bench-small"]["float32"][
      "derived"
  ]
  assert d["sampler_x_hf"] == pytest.approx(2.5)
  # Meeting 3x transformers means running 3x its FLOP rate; equivalently the
  # measured fraction scaled by target / ratio.
  assert d["sampler_target_roofline"] == pytest.approx(
      3.0 * d["transformers_sampler_roofline"]
  )
  assert d["sampler_target_roofline"] == pytest.approx(
      d["sat_jax_sampler_roofline"] * 3.0 / 2.5
  )


def test_bfloat16_rows_are_also_measured_against_a_bfloat16_matmul():
  med = lambda s: {"median_s": s}
  row = {
      "sat_jax": {"sampler": med(2.0), "scoring": med(1.0)},
      "transformers": {"sampler": med(5.0), "scoring": med(1.0)},
  }
  results = {
      "date": "2026-12-06",
      "machine": "test host",
      "roofline": {"flop_per_s": 2e11, "bfloat16": {"flop_per_s": 5e11}},
      "runs": {"bench-tiny": {"float32": row, "bfloat16": dict(row)}},
  }
  runs = bench_foundation.derive(results)["runs"]["bench-tiny"]
  f32, bf16 = runs["float32"]["derived"], runs["bfloat16"]["derived"]
  # float32 rows: the same bound as before. bfloat16 rows: the bound scaled
  # by the float32 / bfloat16 peak ratio (2 / 5).
  assert f32["sampler_target_dtype_roofline"] == pytest.approx(
      f32["sampler_target_roofline"]
  )
  assert bf16["sampler_target_dtype_roofline"] == pytest.approx(
      bf16["sampler_target_roofline"] * 2 / 5
  )
  text = bench_foundation.markdown(results, "cmd")
  expected = f"{100 * bf16['sampler_target_dtype_roofline']:.1f}%"
  assert "500 GFLOP/s (2.50x float32)" in text
  assert f"bench-tiny {expected}." in text
  # Without a bfloat16 measurement (older results.json) there is no note.
  del results["roofline"]["bfloat16"]
  assert "bfloat16 roofline" not in bench_foundation.markdown(results, "cmd")
