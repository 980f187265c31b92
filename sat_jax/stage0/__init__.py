"""Stage 0: plug a stronger model into one slot of a team (DESIGN §5).

Same tokenizer only (the message-level projection for different tokenizers
is not built). Modules:

  projection  project_logits / project_log_probs(pre, cur, delta0) ->
              Projection(log_probs, beta, kl): the per-state geometric
              mixture inside the delta0 ball around pi_cur (bisection).
  product     sample(pre_config, pre_params, cur_config, cur_params,
              tokens, mask, options, delta0, key): the product-of-experts
              agent at decoding time (both models' KV caches).
  distill     projected_kl_from_hidden / projected_kl: the chunked
              KL(pi_new || pi_student) kernel with its custom VJP.
  fit         fit(FitConfig, pre, cur, draw_states, key) -> FitResult: the
              student fitted until the KL quantile monitor passes.
  swap        swap(source_workdir, agent, model_dir, out): a new run
              directory in which only slot j changed (`sat-jax swap`).
"""
