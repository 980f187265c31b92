"""Tests of tokenizer loading, the fit check and chat rendering."""

import pytest
import transformers

from sat_jax import models
from sat_jax import testing


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
  return testing.build_tiny_tokenizer(tmp_path_factory.mktemp("tok") / "t")


def test_tiny_tokenizer_round_trips_and_fits(tok_dir):
  tok = models.load_tokenizer(tok_dir)
  assert isinstance(tok, transformers.PreTrainedTokenizerBase)
  text = "the team has 3 apples plus 12 books?"
  ids = tok.encode(text)
  assert tok.decode(ids) == text
  assert len(ids) < len(text)  # BPE merges happened
  assert len(tok) <= testing.TINY_VOCAB
  assert tok.eos_token == testing.IM_END and tok.pad_token == testing.PAD
  models.check_fits(tok, testing.tiny_config("qwen3"))


def test_render_chat_matches_the_chatml_string(tok_dir):
  tok = models.load_tokenizer(tok_dir)
  messages = [
      {"role": "system", "content": "be brief"},
      {"role": "user", "content": "what is two plus two?"},
  ]
  expected = (
      "<|im_start|>system\nbe brief<|im_end|>\n"
      "<|im_start|>user\nwhat is two plus two?<|im_end|>\n"
      "<|im_start|>assistant\n"
  )
  ids = models.render_chat(tok, messages)
  assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
  assert ids == tok.encode(expected)
  assert tok.decode(ids) == expected
  assert ids.count(tok.convert_tokens_to_ids(testing.IM_START)) == 3
  no_prompt = models.render_chat(tok, messages, add_generation_prompt=False)
  assert tok.decode(no_prompt) == expected[: -len("<|im_start|>assistant\n")]


def test_no_chat_template_is_a_clear_error(tok_dir, tmp_path):
  tok = models.load_tokenizer(tok_dir)
  tok.chat_template = None
  with pytest.raises(models.TokenizerError, match="no chat template"):
    models.render_chat(tok, [{"role": "user", "content": "hi"}])
  ids = models.render_chat(
      tok,
      [{"role": "user", "content": "hi"}],
      chat_template="{{ messages[0]['content'] }}!",
  )
  assert tok.decode(ids) == "hi!"
  with pytest.raises(models.TokenizerError, match=r"messages\[0\] needs"):
    models.render_chat(tok, [{"text": "hi"}], chat_template="x")


def test_fit_check_errors(tok_dir):
  tok = models.load_tokenizer(tok_dir)
  small = testing.tiny_config("qwen3", vocab_size=256)
  with pytest.raises(models.TokenizerError, match=r"has \d+ tokens but .*256"):
    models.check_fits(tok, small)
  tok.pad_token = None
  with pytest.raises(models.TokenizerError, match="no pad_token_id"):
    models.check_fits(tok, testing.tiny_config("qwen3"))


def test_stop_token_ids(tok_dir):
  tok = models.load_tokenizer(tok_dir)
  end = tok.convert_tokens_to_ids(testing.IM_END)
  eot = tok.convert_tokens_to_ids(testing.ENDOFTEXT)
  assert models.stop_token_ids(tok) == (end,)
  assert models.stop_token_ids(tok, [testing.ENDOFTEXT, testing.IM_END]) == (
      end,
      eot,
  )
  with pytest.raises(models.TokenizerError, match="not in the vocabulary"):
    models.stop_token_ids(tok, ["<|nope|>"])


def test_missing_tokenizer_folder(tmp_path):
  with pytest.raises(models.TokenizerError, match="not found"):
    models.load_tokenizer(tmp_path / "nope")
  with pytest.raises(models.TokenizerError, match="cannot load"):
    models.load_tokenizer(tmp_path)
