"""Bad SAT configuration is rejected up front, with the value named."""

import pytest

from sat_jax.core import config as C


@pytest.mark.parametrize("delta", [0.0, -0.1, (0.1, 0.0), float("nan")])
def test_delta_must_be_positive(delta):
  with pytest.raises(ValueError, match=r"delta=.*> 0"):
    C.SATConfig(delta=delta)


def test_infinite_delta_means_no_trust_region():
  cfg = C.SATConfig(delta=(0.1, float("inf")))
  assert cfg.agent_deltas(2) == (0.1, float("inf"))


@pytest.mark.parametrize("q", [0.0, 1.0, 1.5, -0.2])
def test_quantile_must_lie_in_open_unit_interval(q):
  with pytest.raises(ValueError, match=r"quantile=.*\(0, 1\)"):
    C.UpdateConfig(quantile=q)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(method="mappo"), "method"),
        (dict(order="best"), "order"),
        (dict(advantage_mode="gae"), "advantage_mode"),
    ],
)
def test_unknown_names_list_the_valid_ones(kwargs, field):
  with pytest.raises(ValueError, match=f"{field}=.*is not one of") as err:
    C.SATConfig(**kwargs)
  valid = {
      "method": C.METHODS,
      "order": C.ORDERS,
      "advantage_mode": C.ADVANTAGE_MODES,
  }[field]
  assert all(v in str(err.value) for v in valid)


def test_unknown_ratio_mode_and_certificate_variant():
  with pytest.raises(ValueError, match="ratio_mode='tok'"):
    C.UpdateConfig(ratio_mode="tok")
  with pytest.raises(ValueError, match="certificate.variant='pac'"):
    C.CertificateConfig(variant="pac")


def test_explicit_order_must_be_a_permutation():
  assert C.SATConfig(order=(2, 0, 1)).order == (2, 0, 1)
  with pytest.raises(ValueError, match="not a permutation"):
    C.SATConfig(order=(0, 0, 1))
  with pytest.raises(ValueError, match="not a permutation"):
    C.check_permutation((0, 1), 3)


def test_per_agent_delta_length_is_checked():
  cfg = C.SATConfig(delta=(0.1, 0.2))
  assert cfg.agent_deltas(2) == (0.1, 0.2)
  assert C.SATConfig(delta=0.3).agent_deltas(3) == (0.3, 0.3, 0.3)
  with pytest.raises(ValueError, match="2 entries for a team of 3"):
    cfg.agent_deltas(3)


def test_backtracking_that_cannot_change_the_step_is_rejected():
  # One inner step from the restored point ignores beta (grad KL = 0 there).
  one_step = C.UpdateConfig(epochs=1, minibatches=1)
  with pytest.raises(ValueError, match="raising beta cannot change"):
    C.SATConfig(update=one_step)
  C.SATConfig(update=one_step, backtrack_step_scale=0.5)  # halving: fine
  C.SATConfig(update=one_step, max_backtracks=0)  # no retries: fine
  C.SATConfig(update=C.UpdateConfig(epochs=2))


def test_certificate_bounds():
  with pytest.raises(ValueError, match="reward_bounds"):
    C.CertificateConfig(reward_bounds=(1.0, 1.0))
  with pytest.raises(ValueError, match="delta_conf"):
    C.CertificateConfig(delta_conf=0.0)
  with pytest.raises(ValueError, match="gamma"):
    C.CertificateConfig(gamma=1.0)
