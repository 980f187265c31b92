"""Tests for sat_jax.sharding: mesh config, rules, sharded creation, checks."""

import contextlib
import functools

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import numpy as np
import optax
import pytest

from sat_jax import models
from sat_jax import scoring
from sat_jax import sharding
from sat_jax import testing

MESHES = {
    "8x1x1": (("data", -1), ("fsdp", 1), ("tensor", 1)),
    "2x4x1": (("data", 2), ("fsdp", -1), ("tensor", 1)),
    "2x2x2": (("data", 2), ("fsdp", 2), ("tensor", -1)),
}

# Toy MLP-like LM with D == F, so w_in and w_out have the same shape but
# different logical axes: shardings must follow paths, not shapes.
V, D, F = 16, 8, 8
AXES = {
    "embed": ("vocab", "embed"),
    "w_in": ("embed", "mlp"),
    "w_out": ("mlp", "embed"),
    "scale": ("norm",),
}
SPECS = {
    "embed": P("tensor", "fsdp"),
    "w_in": P("fsdp", "tensor"),
    "w_out": P("tensor", "fsdp"),
    "scale": P(None),
}


def toy_init(key):
  k1, k2, k3 = jax.random.split(key, 3)
  return {
      "embed": jax.random.normal(k1, (V, D)),
      "w_in": jax.random.normal(k2, (D, F)) / np.sqrt(D),
      "w_out": jax.random.normal(k3, (F, D)) / np.sqrt(F),
      "scale": jnp.ones((D,)),
  }


def toy_loss(params, tokens_BxT):
  x_BxTxD = params["embed"][tokens_BxT] * params["scale"][None, None]
  x_BxTxD = sharding.shard(x_BxTxD, ("batch", "length", "act_embed"))
  h_BxTxF = jax.nn.gelu(x_BxTxD @ params["w_in"])
  h_BxTxF = sharding.shard(h_BxTxF, ("batch", "length", "act_mlp"))
  logits_BxTxV = (x_BxTxD + h_BxTxF @ params["w_out"]) @ params["embed"].T
  logp_BxTxV = jax.nn.log_softmax(logits_BxTxV[:, :-1])
  nll_BxT = -jnp.take_along_axis(logp_BxTxV, tokens_BxT[:, 1:, None], axis=-1)[
      ..., 0
  ]
  return nll_BxT.mean()


def sgd_adamw_step(params, opt_state, tokens_BxT, tx):
  loss, grads = jax.value_and_grad(toy_loss)(params, tokens_BxT)
  updates, opt_state = tx.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss


# ---------------------------------------------------------------- MeshConfig


@pytest.mark.parametrize(
    "axes, message",
    [
        ((("data", -1), ("model", 2)), "unknown axis 'model'"),
        ((("data", -1), ("fsdp", -1)), "more than one size is -1"),
        ((("data", 2), ("data", 4)), "'data' given twice"),
        ((("data", 0),), "size 0 of 'data'"),
        ((("data", "2"),), "size '2' of 'data'"),
        ((("data",),), "is not \\(name, size\\)"),
        (("data",), "entry 'data' is not \\(name, size\\)"),
        ((("data", True),), "size True of 'data'"),
        ((("data", -2),), "size -2 of 'data'"),
    ],
)
def test_mesh_config_rejects_bad_axes(axes, message):
  with pytest.raises(ValueError, match=message):
    sharding.MeshConfig(axes=axes)


def test_mesh_config_shape_resolves_minus_one_in_canonical_order():
  cfg = sharding.MeshConfig(axes=[["tensor", 2], ["data", -1]])
  assert cfg.axes == (("tensor", 2), ("data", -1))
  assert cfg.shape(8) == {"data": 4, "fsdp": 1, "tensor": 2}
  assert sharding.MeshConfig().shape(8) == {"data": 8, "fsdp": 1, "tensor": 1}


def test_mesh_config_shape_rejects_sizes_that_do_not_divide():
  with pytest.raises(ValueError, match="product 3.*do not divide 8 devices"):
    sharding.MeshConfig(axes=(("data", -1), ("fsdp", 3))).shape(8)
  with pytest.raises(ValueError, match="product 4 != 8 devices"):
    sharding.MeshConfig(axes=(("data", 2), ("fsdp", 2))).shape(8)


def test_make_mesh_has_auto_axes_and_uses_given_devices():
  mesh = sharding.make_mesh(sharding.MeshConfig(axes=MESHES["2x2x2"]))
  assert mesh.axis_names == ("data", "fsdp", "tensor")
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
  assert mesh.axis_types == (AxisType.Auto,) * 3
  sub = sharding.make_mesh(sharding.MeshConfig(), devices=jax.devices()[4:])
  assert dict(sub.shape) == {"data": 4, "fsdp": 1, "tensor": 1}
  assert set(sub.devices.flat) == set(jax.devices()[4:])


# --------------------------------------------------------------------- rules


def test_merge_rules_overrides_by_name_and_validates():
  rules = sharding.merge_rules([("mlp", "fsdp"), ("experts", ["data"])])
  table = dict(rules)
  assert table["mlp"] == "fsdp"
  assert table["experts"] == ("data",)
  assert table["embed"] == "fsdp"  # untouched default
  assert len(rules) == len(sharding.DEFAULT_RULES) + 1
  with pytest.raises(ValueError, match="'mlp'.*'model' is not None"):
    sharding.merge_rules([("mlp", "model")])
  cfg = sharding.MeshConfig(rules=(("vocab", None),))
  assert dict(cfg.logical_rules())["vocab"] is None
  with pytest.raises(ValueError, match="'vocab'"):
    sharding.MeshConfig(rules=(("vocab", "gpu"),))


def test_logical_to_spec_uses_each_mesh_axis_once():
  assert sharding.logical_to_spec(("batch", "length", "act_mlp")) == P(
      ("data", "fsdp"), None, "tensor"
  )
  # embed -> fsdp is already taken by batch: that dim stays unsharded.
  assert sharding.logical_to_spec(("batch", "embed")) == P(
      ("data", "fsdp"), None
  )
  with pytest.raises(KeyError, match="'nope' has no rule"):
    sharding.logical_to_spec(("nope",))


def test_logical_to_sharding_falls_back_for_indivisible_dims():
  mesh = sharding.make_mesh(sharding.MeshConfig(axes=MESHES["2x2x2"]))
  axes = {"lm_head": ("embed", "vocab"), "tokens": ("batch", "length")}
  shapes = {
      "lm_head": jax.ShapeDtypeStruct((64, 4099), jnp.float32),
      "tokens": jax.ShapeDtypeStruct((6, 5), jnp.int32),
  }
  out = sharding.logical_to_sharding(axes, mesh, shapes=shapes)
  # 4099 is odd: replicated along vocab; batch 6 = 2 * 3 keeps "data" only.
  assert out["lm_head"].spec == P("fsdp", None)
  assert out["tokens"].spec == P("data", None)
  no_shapes = sharding.logical_to_sharding(axes, mesh)
  assert no_shapes["lm_head"].spec == P("fsdp", "tensor")
  assert no_shapes["tokens"].spec == P(("data", "fsdp"), None)
  # The fallback lets a jitted init with these shardings run at all.
  make = jax.jit(lambda: jnp.zeros((64, 4099)), out_shardings=out["lm_head"])
  assert make().sharding.spec == P("fsdp", None)
  with pytest.raises(ValueError, match="1 logical names"):
    sharding.logical_to_sharding(
        {"w": ("embed",)}, mesh, shapes={"w": shapes["tokens"]}
    )
  with pytest.raises(ValueError, match="2 leaves"):
    sharding.logical_to_sharding(axes, mesh, shapes={"w": shapes["tokens"]})


def test_logical_to_sharding_drops_axes_missing_from_mesh_and_uses_rules():
  mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
  out = sharding.logical_to_sharding(AXES, mesh)
  assert out["w_in"].spec == P(None, None)
  rules = sharding.merge_rules([("mlp", "data")])
  out = sharding.logical_to_sharding(AXES, mesh, rules=rules)
  assert out["w_in"].spec == P(None, "data")
  with sharding.logical_rules(rules):
    assert (
        sharding.logical_to_sharding(AXES, mesh)["w_in"].spec
        == out["w_in"].spec
    )


def test_shard_constrains_under_mesh_and_is_noop_without():
  x_BxD = jnp.arange(8 * 6, dtype=jnp.float32).reshape(8, 6)
  f = jax.jit(lambda x: sharding.shard(x * 2, ("batch", "act_mlp")))
  np.testing.assert_array_equal(f(x_BxD), x_BxD * 2)  # no mesh: no-op
  mesh = sharding.make_mesh(sharding.MeshConfig(axes=MESHES["2x2x2"]))
  with jax.set_mesh(mesh):
    y = f(x_BxD)
    # 5 rows do not divide data * fsdp = 4: the constraint falls back.
    z = jax.jit(lambda x: sharding.shard(x, ("batch", "act_mlp")))(
        jnp.ones((5, 6))
    )
  assert y.sharding.spec == P(("data", "fsdp"), "tensor")
  np.testing.assert_array_equal(y, x_BxD * 2)
  assert z.sharding.spec in (P(None, "tensor"), P(None, "tensor", None))
  with pytest.raises(ValueError, match="1 logical names"):
    with jax.set_mesh(mesh):
      sharding.shard(x_BxD, ("batch",))


# -------------------------------------------------------- sharded creation


@pytest.mark.parametrize("name", ["2x2x2"])  # all meshes: the model tests
def test_toy_params_born_sharded_and_step_matches_single_device(name):
  mesh = sharding.make_mesh(sharding.MeshConfig(axes=MESHES[name]))
  key = jax.random.key(0)
  params = sharding.init_sharded(toy_init, AXES, mesh, key)
  ref_params = jax.jit(toy_init)(key)  # eager rounds 1/sqrt(D) differently
  for k, spec in SPECS.items():
    assert params[k].sharding.spec == spec, k
    assert params[k].sharding.mesh == mesh
    np.testing.assert_array_equal(params[k], ref_params[k])
  assert not params["w_in"].sharding.is_fully_replicated
  sharding.assert_params_sharded(params, min_size=V * D // 2)

  tx = optax.adamw(1e-2, weight_decay=0.1)
  opt_state = sharding.init_opt_state_sharded(tx, params, mesh)
  adam = opt_state[0]
  for k in SPECS:
    assert adam.mu[k].sharding == params[k].sharding, k
    assert adam.nu[k].sharding == params[k].sharding, k
  assert adam.count.sharding.spec == P()
  assert adam.count.sharding.mesh == mesh

  tokens_BxT = jax.random.randint(jax.random.key(1), (8, 6), 0, V)
  tokens_sharding = sharding.logical_to_sharding(
      ("batch", "length"), mesh, shapes=tokens_BxT
  )
  step = functools.partial(sgd_adamw_step, tx=tx)
  state_shardings = jax.tree.map(lambda x: x.sharding, (params, opt_state))
  replicated = NamedSharding(mesh, P())
  with jax.set_mesh(mesh):
    new_params, new_opt, loss = jax.jit(
        step, out_shardings=(*state_shardings, replicated)
    )(params, opt_state, jax.device_put(tokens_BxT, tokens_sharding))
  ref_new, _, ref_loss = jax.jit(step)(
      ref_params, tx.init(ref_params), tokens_BxT
  )
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
  for k in SPECS:
    np.testing.assert_allclose(new_params[k], ref_new[k], rtol=1e-5, atol=1e-6)
    assert new_params[k].sharding.spec == params[k].sharding.spec, k
  assert int(new_opt[0].count) == 1


def test_assert_params_sharded_names_replicated_leaves():
  mesh = sharding.make_mesh(sharding.MeshConfig(axes=MESHES["2x4x1"]))
  params = sharding.init_sharded(toy_init, AXES, mesh, jax.random.key(0))
  params["w_in"] = jax.device_put(params["w_in"], NamedSharding(mesh, P()))
  params["extra"] = jnp.zeros((V, D))  # a single-device array: not on a mesh
  with pytest.raises(AssertionError, match="2 leaves") as err:
    sharding.assert_params_sharded(params, min_size=V * D // 2)
  assert "['w_in'] (8, 8): P()" in str(err.value)
  assert "['extra'] (16, 8): not on a mesh" in str(err.value)
  # Below min_size nothing is checked; a data-only mesh passes by design.
  sharding.assert_params_sharded(params, min_size=V * D + 1)
  dp = sharding.make_mesh(sharding.MeshConfig())
  replicated = jax.device_put(params["w_in"], NamedSharding(dp, P()))
  sharding.assert_params_sharded({"w": replicated}, min_size=1)


def test_follow_shardings_matches_paths_not_shapes():
  mesh = sharding.make_mesh(sharding.MeshConfig(axes=MESHES["2x2x2"]))
  like = {
      "a": jax.ShapeDtypeStruct(
          (4, 4), jnp.float32, sharding=NamedSharding(mesh, P("fsdp", "tensor"))
      ),
      "b": jax.ShapeDtypeStruct(
          (4, 4), jnp.float32, sharding=NamedSharding(mesh, P("tensor", "fsdp"))
      ),
  }
  tree = {
      "mu": {"a": like["a"], "b": like["b"]},
      "factored": {"a": jax.ShapeDtypeStruct((4,), jnp.float32)},
      "count": jax.ShapeDtypeStruct((), jnp.int32),
  }
  out = sharding.follow_shardings(tree, like, mesh)
  assert out["mu"]["a"].spec == P("fsdp", "tensor")
  assert out["mu"]["b"].spec == P("tensor", "fsdp")
  assert out["factored"]["a"].spec == P()  # same path, other shape
  assert out["count"].spec == P()


# ------------------------------------------------- tiny models on the meshes

# PartitionSpecs of the tiny models' parameters under DEFAULT_RULES, written
# out by hand from the layouts in sat_jax/models/transformer.py.
MODEL_SPECS = {
    "embed": P("tensor", "fsdp"),
    "lm_head": P("fsdp", "tensor"),
    "final_norm": P(None),
    "layers": {
        "attn_norm": P(None, None),
        "mlp_norm": P(None, None),
        "q_proj": P(None, "fsdp", "tensor", None),
        "k_proj": P(None, "fsdp", "tensor", None),
        "v_proj": P(None, "fsdp", "tensor", None),
        "o_proj": P(None, "tensor", None, "fsdp"),
        "q_bias": P(None, "tensor", None),
        "k_bias": P(None, "tensor", None),
        "v_bias": P(None, "tensor", None),
        "q_norm": P(None, None),
        "k_norm": P(None, None),
        "gate_proj": P(None, "fsdp", "tensor"),
        "up_proj": P(None, "fsdp", "tensor"),
        "down_proj": P(None, "tensor", "fsdp"),
    },
}
B, T = 8, 12
# f32 everywhere; sharded matmuls only reorder sums, so differences are a few
# ulps. Measured max abs differences are about 1e-7 (logits, log-probs) and
# 1e-9 (updated params); these bounds leave a wide margin.
ATOL_LOGITS, ATOL_PARAMS = 2e-5, 1e-6


def model_batch(config):
  tokens_BxT = jax.random.randint(
      jax.random.key(2), (B, T), 0, config.vocab_size
  )
  # Right padding on half the rows, so masked positions are exercised too.
  lengths_B = jnp.array([T, T - 3, T, T - 5, T, 7, T, T - 1])
  mask_BxT = (jnp.arange(T)[None, :] < lengths_B[:, None]).astype(jnp.int32)
  return tokens_BxT, mask_BxT


def model_loss(params, tokens_BxT, mask_BxT, config):
  logp_BxT = scoring.token_logprobs(config, params, tokens_BxT, mask_BxT)
  return -jnp.sum(logp_BxT) / jnp.sum(mask_BxT)


def model_outputs(params, opt_state, tokens_BxT, mask_BxT, config, tx):
  """Logits, log-probs and one adamw step: one program, compiled once."""
  loss, grads = jax.value_and_grad(model_loss)(
      params, tokens_BxT, mask_BxT, config
  )
  updates, opt_state = tx.update(grads, opt_state, params)
  return {
      "logits": models.forward(config, params, tokens_BxT, mask_BxT),
      "logp": scoring.token_logprobs(config, params, tokens_BxT, mask_BxT),
      "step": (optax.apply_updates(params, updates), opt_state, loss),
  }


def run_model(config, params, opt_state, tokens_BxT, mask_BxT, tx, mesh=None):
  """`model_outputs`, on one device or with the state's shardings kept."""
  fn = functools.partial(model_outputs, config=config, tx=tx)
  if mesh is None:
    return jax.jit(fn)(params, opt_state, tokens_BxT, mask_BxT)
  state = jax.tree.map(lambda x: x.sharding, (params, opt_state))
  # None: the compiler picks the logits' sharding (the constraints decide).
  out_shardings = {
      "logits": None,
      "logp": None,
      "step": (*state, NamedSharding(mesh, P())),
  }
  with jax.set_mesh(mesh):
    return jax.jit(fn, out_shardings=out_shardings)(
        params, opt_state, tokens_BxT, mask_BxT
    )


_REFERENCE = {}


def reference(family):
  """Single-device results of the tiny `family` model (computed once)."""
  if family not in _REFERENCE:
    config = testing.tiny_config(family)
    init = jax.jit(functools.partial(models.init_params, config))
    params = init(jax.random.key(0))
    # eps = 1e-4, not 1e-8: adam's first step is lr * g / (|g| + eps), whose
    # slope 1 / eps would amplify last-ulp gradient differences of entries
    # with |g| ~ 1e-8 into visible parameter differences.
    tx = optax.adamw(1e-3, eps=1e-4, weight_decay=0.1)
    tokens_BxT, mask_BxT = model_batch(config)
    out = run_model(config, params, tx.init(params), tokens_BxT, mask_BxT, tx)
    _REFERENCE[family] = (config, params, tx, out)
  return _REFERENCE[family]


def sharded_model(config, mesh, tx, ref_params, born_sharded):
  """Tiny-model params and adamw state on `mesh`, checked as such.

  born_sharded: create them with init_sharded (one more compile), else put
  the reference parameters onto the same shardings.
  """
  if born_sharded:
    init = functools.partial(models.init_params, config)
    params = sharding.init_sharded(
        init, models.param_axes(config), mesh, jax.random.key(0)
    )
  else:
    shardings = sharding.logical_to_sharding(
        models.param_axes(config), mesh, shapes=ref_params
    )
    params = jax.device_put(ref_params, shardings)
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  for path, leaf in flat:
    spec = functools.reduce(lambda t, k: t[k.key], path, MODEL_SPECS)
    assert leaf.sharding.spec == spec, jax.tree_util.keystr(path)
    assert leaf.sharding.mesh == mesh
  sharding.assert_params_sharded(params, min_size=1024)
  opt_state = sharding.init_opt_state_sharded(tx, params, mesh)
  for moments in (opt_state[0].mu, opt_state[0].nu):
    assert jax.tree.map(lambda x: x.sharding, moments) == jax.tree.map(
        lambda x: x.sharding, params
    )
  assert opt_state[0].count.sharding.spec == P()
  sharding.assert_params_sharded(opt_state, min_size=1024)
  return params, opt_state


@pytest.mark.parametrize("family", ["qwen3", "qwen2", "llama"])
def test_tiny_model_param_shardings(family):
  # The shardings init_sharded gives each family, without compiling an init.
  config = testing.tiny_config(family)
  mesh = sharding.make_mesh(sharding.MeshConfig(axes=MESHES["2x2x2"]))
  init = functools.partial(models.init_params, config)
  shapes = jax.eval_shape(init, jax.random.key(0))
  shardings = sharding.logical_to_sharding(
      models.param_axes(config), mesh, shapes=shapes
  )
  names = set()
  for path, s in jax.tree_util.tree_flatten_with_path(shardings)[0]:
    names.add(path[-1].key)
    spec = functools.reduce(lambda t, k: t[k.key], path, MODEL_SPECS)
    assert s.spec == spec, jax.tree_util.keystr(path)
  assert ("lm_head" in names) == (not config.tie_embeddings)
  assert ("q_bias" in names) == config.qkv_bias
  abstract = jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      shapes,
      shardings,
  )
  sharding.assert_params_sharded(abstract, min_size=1024)


def test_tensor_parallel_mesh_shards_the_kv_projections_of_a_real_model():
  # Llama-3.1-8B on tensor=8: its 8 kv heads split over the 8 devices, so
  # k_proj / v_proj (134M parameters each) are not copied onto every one.
  config = models.get_preset("llama-3.1-8b")
  mesh = sharding.make_mesh(
      sharding.MeshConfig(axes=(("data", 1), ("fsdp", 1), ("tensor", 8)))
  )
  shapes = jax.eval_shape(
      functools.partial(models.init_params, config), jax.random.key(0)
  )
  shardings = sharding.logical_to_sharding(
      models.param_axes(config), mesh, shapes=shapes
  )
  for name in ("k_proj", "v_proj"):
    shape = shapes["layers"][name].shape  # [L, D, K, Hd] = [32, 4096, 8, 128]
    per_device = shardings["layers"][name].shard_shape(shape)
    assert per_device == (32, 4096, 1, 128), name
  abstract = jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      shapes,
      shardings,
  )
  # Every matrix is split; the per-layer norm scales ([L, D], 0.5 MB) stay
  # whole by design (sharding them buys nothing and adds gathers).
  sharding.assert_params_sharded(abstract, min_size=2**18)


@pytest.mark.parametrize(
    "family, mesh_name",
    [("qwen3", n) for n in MESHES]
    + [pytest.param("qwen2", "2x2x2", marks=pytest.mark.slow)],
)
def test_tiny_model_on_mesh_matches_single_device(family, mesh_name):
  config, ref_params, tx, ref = reference(family)
  mesh = sharding.make_mesh(sharding.MeshConfig(axes=MESHES[mesh_name]))
  params, opt_state = sharded_model(
      config, mesh, tx, ref_params, born_sharded=mesh_name == "2x2x2"
  )
  assert_trees_equal(params, ref_params)  # born sharded: same random values

  tokens_BxT, mask_BxT = model_batch(config)
  data = sharding.logical_to_sharding(("batch", "length"), mesh)
  tokens_BxT, mask_BxT = jax.device_put((tokens_BxT, mask_BxT), data)
  out = run_model(config, params, opt_state, tokens_BxT, mask_BxT, tx, mesh)

  for name in ("logits", "logp"):
    np.testing.assert_allclose(
        out[name], ref[name], rtol=1e-5, atol=ATOL_LOGITS, err_msg=name
    )
  new_params, new_opt, loss = out["step"]
  ref_params_1, ref_opt_1, ref_loss = ref["step"]
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
  assert_trees_close(new_params, ref_params_1, ATOL_PARAMS)
  assert_trees_close(new_opt, ref_opt_1, ATOL_PARAMS)
  assert jax.tree.map(lambda x: x.sharding.spec, new_params) == jax.tree.map(
      lambda x: x.sharding.spec, params
  )
  # The activation constraints are in force: the logits carry the sharding
  # of their logical names (batch over data x fsdp, vocab over tensor).
  expected = NamedSharding(mesh, P(("data", "fsdp"), None, "tensor"))
  assert out["logits"].sharding.is_equivalent_to(expected, 3), out[
      "logits"
  ].sharding


def test_activation_constraints_reach_the_compiled_program():
  config = testing.tiny_config("qwen3")
  mesh = sharding.make_mesh(sharding.MeshConfig(axes=MESHES["2x2x2"]))
  # Lowering needs only shapes and shardings: abstract params, no compile.
  init = functools.partial(models.init_params, config)
  shapes = jax.eval_shape(init, jax.random.key(0))
  shardings = sharding.logical_to_sharding(
      models.param_axes(config), mesh, shapes=shapes
  )
  params = jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      shapes,
      shardings,
  )
  tokens_BxT, mask_BxT = model_batch(config)
  fwd = jax.jit(functools.partial(models.hidden_states, config))
  with jax.set_mesh(mesh):
    text = fwd.lower(params, tokens_BxT, mask_BxT).as_text()
  # One constraint per shard() call site that the trace passes through.
  assert text.count("sharding_constraint") >= 5, text[:2000]
  assert '{"tensor"}' in text  # the act_mlp / act_heads constraints
  # Without a mesh, shard() adds nothing.
  assert (
      "sharding_constraint"
      not in fwd.lower(params, tokens_BxT, mask_BxT).as_text()
  )


def assert_trees_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def assert_trees_close(a, b, atol):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for (path, x), y in zip(
      jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b)
  ):
    np.testing.assert_allclose(
        np.asarray(x),
        np.asarray(y),
        rtol=1e-5,
        atol=atol,
        err_msg=jax.tree_util.keystr(path),
    )
