"""Stage 0: plug a stronger model into one slot of a team (DESIGN §5).

A new model with the slot's tokenizer is projected token by token
(projection / product / distill / fit); one with another tokenizer is
projected at the message level (messages). Modules:

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
  messages    tilt(...) and fit_messages(MessageFitConfig, pre, cur, agent,
              draw_contexts, key) -> MessageFitResult: the projection over
              whole messages when the two models' tokenizers differ.
  swap        swap(source_workdir, agent, model_dir, out): a new run
              directory in which only slot j changed (`sat-jax swap`).
"""
