"""Per-agent rendering and incremental token streams (tokenizer only)."""

import numpy as np
import pytest
import transformers

from sat_jax import testing
from sat_jax.team import transcript

Message = transcript.Message
TASK, ENV = transcript.TASK, transcript.ENV

# Llama-3-like: trims contents, closes turns with <|im_end|> (the tiny
# tokenizer's end-of-turn token), no generation-prompt newline.
TRIM_TEMPLATE = (
    "{%- for m in messages %}"
    "{{- '<|im_start|>' + m['role'] + ':' + (m['content'] | trim)"
    " + '<|im_end|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant:' }}{%- endif %}"
)
# Drops every assistant turn but a final one: not prefix-stable.
FORGETFUL_TEMPLATE = (
    "{%- for m in messages %}"
    "{%- if m['role'] != 'assistant' or loop.last %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  path = testing.build_tiny_tokenizer(tmp_path_factory.mktemp("tok"))
  return transformers.AutoTokenizer.from_pretrained(str(path))


def _renderer(tok, **kwargs):
  kwargs.setdefault("system_prompt", "Be brief.")
  return transcript.Renderer(tok, **kwargs)


def _turn(r, stream, messages, viewer):
  """Renders agent `viewer`'s turn into its stream; returns the rendering."""
  (text,) = r.render([r.chat(messages, viewer)])
  (ids,) = r.encode([stream.delta(text, f"agent {viewer}", r.template)])
  stream.add_context(text, ids)
  return text


def _say(r, stream, content, stop=True):
  """Appends a 'sampled' message: content's ids, then the stop token."""
  (ids,) = r.encode([content])
  if stop:
    ids = np.append(ids, r.stop_ids[0]).astype(np.int32)
  stream.add_action(
      ids,
      np.full(len(ids), -1.0, np.float32),
      content.strip(),
      r.stop_texts[r.stop_ids[0]] if stop else None,
  )


def test_roles_and_tags_of_one_viewer(tok):
  r = _renderer(tok, agent_tag="<{number}|{index}> ", env_tag="ENV: ")
  msgs = [
      Message(TASK, "2+2?"),
      Message(0, "four", 0),
      Message(1, "4", 0),
      Message(ENV, "ok", 0),
  ]
  assert r.chat(msgs, viewer=1) == (
      ("system", "Be brief."),
      ("user", "2+2?"),
      ("user", "<1|0> four"),
      ("assistant", "4"),
      ("user", "ENV: ok"),
  )


def test_the_prompt_an_agent_samples_from_is_its_rendering(tok):
  r, s = _renderer(tok), transcript.Stream()
  msgs = [Message(TASK, "Compute 1+2.")]
  first = _turn(r, s, msgs, 0)
  assert first == (
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
      "Compute 1+2.<|im_end|>\n<|im_start|>assistant\n"
  )
  assert tok.decode(s.tokens().tolist()) == first
  _say(r, s, "1+2=3 \n")  # trailing whitespace: the message text strips it
  msgs += [Message(0, "1+2=3", 0), Message(1, "I agree: 3", 0)]
  second = _turn(r, s, msgs, 0)
  assert second.endswith(
      "1+2=3<|im_end|>\n<|im_start|>user\n[Agent 2] I agree: 3<|im_end|>\n"
      "<|im_start|>assistant\n"
  )
  decoded = tok.decode(s.tokens().tolist())
  # The sampled whitespace stays (ids are never re-tokenised) and the stop
  # token is not repeated by the template's closing.
  assert decoded == second.replace("1+2=3<|im_end|>", "1+2=3 \n<|im_end|>")
  tokens, own, logp = s.arrays()
  assert own.sum() == len(r.encode(["1+2=3 \n"])[0]) + 1
  assert np.all(logp[own] == -1.0) and np.all(logp[~own] == 0.0)
  assert tokens[own][-1] == r.stop_ids[0]


def test_a_message_cut_before_its_stop_token_gets_the_closing(tok):
  r, s = _renderer(tok), transcript.Stream()
  msgs = [Message(TASK, "Go.")]
  _turn(r, s, msgs, 0)
  _say(r, s, "unfinished", stop=False)
  msgs += [Message(0, "unfinished", 0), Message(ENV, "next", 0)]
  text = _turn(r, s, msgs, 0)
  assert tok.decode(s.tokens().tolist()) == text
  assert text.count("unfinished<|im_end|>") == 1


def test_a_trimming_template_stays_prefix_stable(tok):
  r, s = _renderer(tok, chat_template=TRIM_TEMPLATE), transcript.Stream()
  msgs = [Message(TASK, "Q")]
  _turn(r, s, msgs, 0)
  _say(r, s, "  spaced answer \n")
  msgs += [Message(0, "spaced answer", 0), Message(1, "B", 0)]
  text = _turn(r, s, msgs, 0)
  assert text.endswith(
      "assistant:spaced answer<|im_end|><|im_start|>user:"
      "[Agent 2] B<|im_end|><|im_start|>assistant:"
  )


def test_a_template_that_rewrites_history_is_a_clear_error(tok):
  r, s = _renderer(tok, chat_template=FORGETFUL_TEMPLATE), transcript.Stream()
  msgs = [Message(TASK, "Q")]
  _turn(r, s, msgs, 0)
  _say(r, s, "first")
  msgs += [Message(0, "first", 0), Message(1, "B", 0)]
  with pytest.raises(transcript.TranscriptError, match="agent 0.*not prefix"):
    _turn(r, s, msgs, 0)


def test_no_chat_template_is_a_clear_error(tok):
  bare = transformers.PreTrainedTokenizerFast(
      tokenizer_object=tok.backend_tokenizer, eos_token="<|im_end|>"
  )
  with pytest.raises(transcript.TranscriptError, match="agent 3.*no chat"):
    transcript.Renderer(bare, name="agent 3")
  # A template passed in is enough.
  r = transcript.Renderer(bare, chat_template=testing.CHAT_TEMPLATE)
  assert r.render([r.chat([Message(TASK, "x")], 0)])[0].endswith("assistant\n")


def test_end_of_turn_tokens_are_stop_tokens(tok):
  r = _renderer(tok)
  assert r.stop_ids == (tok.convert_tokens_to_ids("<|im_end|>"),)
  assert r.pad_id == tok.pad_token_id


def test_agents_with_the_same_tokenizer_share_one_renderer(tok, tmp_path):
  other = transformers.AutoTokenizer.from_pretrained(
      str(testing.build_tiny_tokenizer(tmp_path / "b", vocab_size=300))
  )
  same = transformers.AutoTokenizer.from_pretrained(tok.name_or_path)
  kwargs = dict(system_prompt=None, agent_tag="[{number}] ", env_tag="")
  shared = transcript.make_renderers([tok, same, other], None, **kwargs)
  assert shared[0] is shared[1] and shared[2] is not shared[0]
  # The same tokenizer.json and template with another eos (a base model
  # beside its instruct model): other stop ids, so a renderer of its own.
  base = transformers.AutoTokenizer.from_pretrained(
      tok.name_or_path, eos_token="<|endoftext|>"
  )
  pair = transcript.make_renderers([tok, base], None, **kwargs)
  assert pair[0] is not pair[1] and pair[0].stop_ids != pair[1].stop_ids
  apart = transcript.make_renderers([tok, tok], None, share=False, **kwargs)
  assert apart[0] is not apart[1]
  with pytest.raises(ValueError, match="1 chat templates for 2 agents"):
    transcript.make_renderers([tok, tok], [None], **kwargs)
