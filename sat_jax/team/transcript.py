"""Team transcripts as text, and each agent's incremental token stream of them.

The transcript of an episode is a list of `Message`s (speaker: the task
prompt, agent j, or the environment). Agent k sees it through a `Renderer`:
its own chat template and tokenizer, with

  the task's system prompt          -> system
  the task prompt                   -> user
  k's own messages                  -> assistant
  agent j's messages (j != k)       -> user, content = agent_tag(j) + text
  the environment's messages        -> user, content = env_tag + text

Incremental token streams (`Stream`): at each of k's turns the rendering of
the messages k can see, with the generation prompt, is computed as a string
S. The previous rendering plus k's own message text (the stream's `cursor`)
must be a string prefix of S; the suffix S[len(cursor):] (the delta: the
end of k's last turn, what others said since, the generation prompt) is
tokenised alone and appended, then k samples, and k's sampled ids are
appended verbatim. So the prompt k sampled from is exactly the prefix of its
stream and sampled ids are never re-tokenised: the trainer's recomputed
log-probs match the behaviour log-probs by construction.

Two details keep the stream what the template would write. A message's text
is the decoded sample without special tokens, stripped of surrounding
whitespace (templates such as Llama-3's trim it). When a message ended with
a stop token whose text is how the template closes the turn (ChatML's
<|im_end|>), that text is dropped from the front of the next delta, since
the sampled stop id is already in the stream. A template that is not
prefix-stable (one that rewrites earlier turns, e.g. by stripping reasoning
from them) raises `TranscriptError` naming the agent and the template.
"""

import dataclasses
from typing import Any, Sequence

import numpy as np

from sat_jax.models import tokenizer as tokenizer_lib

TASK = -1  # speaker id of the task prompt
ENV = -2  # speaker id of the environment
# End-of-turn tokens added to eos as stop tokens when the vocab has them.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|eot|>")


class TranscriptError(ValueError):
  """A tokenizer or template cannot render the transcript; names the agent."""


@dataclasses.dataclass(frozen=True)
class Message:
  """One transcript message. `audience` None: everyone; j: only agent j."""

  speaker: int  # agent index >= 0, TASK or ENV
  text: str
  round: int = -1  # the team round it was said in (-1: before round 0)
  audience: int | None = None

  def visible_to(self, agent: int) -> bool:
    return self.audience is None or self.audience == agent

  def to_json(self) -> dict[str, Any]:
    names = {TASK: "task", ENV: "environment"}
    speaker = names.get(self.speaker, f"agent{self.speaker}")
    row = {"speaker": speaker, "round": self.round, "text": self.text}
    if self.audience is not None:
      row["to"] = f"agent{self.audience}"
    return row


def _fingerprint(tokenizer: Any) -> tuple[Any, ...]:
  """Equal for tokenizers that encode and decode every string alike."""
  backend = getattr(tokenizer, "backend_tokenizer", None)
  body = backend.to_str() if backend is not None else id(tokenizer)
  return (
      type(tokenizer).__name__,
      body,
      bool(getattr(tokenizer, "clean_up_tokenization_spaces", False)),
  )


class Renderer:
  """One tokenizer and chat template: chats per viewer, rendered, tokenised.

  Renderings and tokenisations are cached by their exact input (cleared by
  `clear_cache`), so episodes of one prompt, and agents that share this
  renderer (the same-tokenizer fast path), render and tokenise a given chat
  once. Caching changes no result: both are deterministic functions.
  """

  def __init__(
      self,
      tokenizer: Any,
      *,
      chat_template: str | None = None,
      system_prompt: str | None = None,
      agent_tag: str = "[Agent {number}] ",
      env_tag: str = "",
      name: str = "agent",
  ):
    self.tokenizer, self.name = tokenizer, name
    self.template = chat_template or getattr(tokenizer, "chat_template", None)
    if not self.template or not isinstance(self.template, str):
      raise TranscriptError(
          f"{name}: tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has"
          " no chat template and none was given (pass chat_templates=)"
      )
    self.system_prompt, self.agent_tag, self.env_tag = (
        system_prompt,
        agent_tag,
        env_tag,
    )
    self.pad_id = tokenizer.pad_token_id
    if self.pad_id is None:
      self.pad_id = tokenizer.eos_token_id
    if self.pad_id is None:
      raise TranscriptError(f"{name}: tokenizer has neither pad nor eos id")
    extra = [
        t
        for t in END_OF_TURN_TOKENS
        if tokenizer.convert_tokens_to_ids(t)
        not in (None, tokenizer.unk_token_id)
    ]
    self.stop_ids = tokenizer_lib.stop_token_ids(tokenizer, extra)
    if not self.stop_ids:
      raise TranscriptError(f"{name}: tokenizer has no eos or end-of-turn id")
    self.stop_texts = {
        i: tokenizer.decode([i], skip_special_tokens=False)
        for i in self.stop_ids
    }
    self._renders: dict[tuple, str] = {}
    self._encodings: dict[str, np.ndarray] = {}

  def share_key(self) -> tuple[Any, ...]:
    """Renderers with equal keys produce identical streams.

    The stop and pad ids are part of it: a base and an instruct checkpoint
    often share tokenizer.json and template but not their eos token.
    """
    return (
        _fingerprint(self.tokenizer),
        self.stop_ids,
        self.pad_id,
        self.template,
        self.system_prompt,
        self.agent_tag,
        self.env_tag,
    )

  def clear_cache(self) -> None:
    self._renders.clear()
    self._encodings.clear()

  def chat(
      self, messages: Sequence[Message], viewer: int
  ) -> tuple[tuple[str, str], ...]:
    """(role, content) turns of `messages` as agent `viewer` sees them."""
    turns = []
    if self.system_prompt:
      turns.append(("system", self.system_prompt))
    for m in messages:
      if m.speaker == viewer:
        turns.append(("assistant", m.text))
      elif m.speaker == TASK:
        turns.append(("user", m.text))
      elif m.speaker == ENV:
        turns.append(("user", self.env_tag + m.text))
      else:
        tag = self.agent_tag.format(number=m.speaker + 1, index=m.speaker)
        turns.append(("user", tag + m.text))
    return tuple(turns)

  def render(
      self, chats: Sequence[tuple[tuple[str, str], ...]], who: str = ""
  ) -> list[str]:
    """Each chat rendered with the generation prompt (cached)."""
    out = []
    for chat in chats:
      text = self._renders.get(chat)
      if text is None:
        try:
          text = self.tokenizer.apply_chat_template(
              [{"role": r, "content": c} for r, c in chat],
              chat_template=self.template,
              add_generation_prompt=True,
              tokenize=False,
          )
        except Exception as e:  # jinja raises its own error types
          raise TranscriptError(
              f"{who or self.name}: the chat template failed on a transcript of"
              f" roles {[r for r, _ in chat]}: {type(e).__name__}: {e}"
          ) from e
        self._renders[chat] = text
      out.append(text)
    return out

  def encode(self, texts: Sequence[str]) -> list[np.ndarray]:
    """int32 ids of each text, no special tokens added (one batch call)."""
    todo = sorted({t for t in texts if t not in self._encodings})
    if todo:
      ids = self.tokenizer(list(todo), add_special_tokens=False)["input_ids"]
      for text, row in zip(todo, ids):
        self._encodings[text] = np.asarray(row, np.int32)
    return [self._encodings[t] for t in texts]

  def decode(self, ids: Sequence[np.ndarray]) -> list[str]:
    """Message texts of sampled ids: special tokens dropped, stripped."""
    if not ids:
      return []
    texts = self.tokenizer.batch_decode(
        [np.asarray(i).tolist() for i in ids], skip_special_tokens=True
    )
    return [t.strip() for t in texts]


class Stream:
  """Agent k's token stream of one episode: context chunks and own samples."""

  def __init__(self):
    self._ids: list[np.ndarray] = []
    self._logp: list[np.ndarray] = []
    self._own: list[bool] = []
    self.length = 0
    self.own_tokens = 0
    self.cut_messages = 0  # own messages that hit max_new_tokens unstopped
    self.cursor = ""  # the text the stream stands for, in template terms
    self.pending_stop: str | None = None  # stop text already in the stream
    self._tokens_cache: np.ndarray | None = None

  def delta(self, rendered: str, who: str, template: str) -> str:
    """The part of `rendered` not yet in the stream (module docstring)."""
    if not rendered.startswith(self.cursor):
      at = next(
          (i for i, (a, b) in enumerate(zip(self.cursor, rendered)) if a != b),
          min(len(self.cursor), len(rendered)),
      )
      raise TranscriptError(
          f"{who}: the chat template is not prefix-stable (the new rendering"
          f" differs from the previous one at character {at}:"
          f" {self.cursor[at:at + 40]!r} became {rendered[at:at + 40]!r});"
          f" template starts {template[:80]!r}. Use a template that does not"
          " rewrite earlier turns."
      )
    delta = rendered[len(self.cursor) :]
    if self.pending_stop and delta.startswith(self.pending_stop):
      delta = delta[len(self.pending_stop) :]
    return delta

  def add_context(self, rendered: str, ids: np.ndarray) -> None:
    self._append(ids, np.zeros(ids.shape, np.float32), False)
    self.cursor, self.pending_stop = rendered, None

  def add_action(
      self, ids: np.ndarray, logp: np.ndarray, text: str, stop: str | None
  ) -> None:
    self._append(ids, logp, True)
    self.own_tokens += len(ids)
    self.cut_messages += stop is None
    self.cursor, self.pending_stop = self.cursor + text, stop

  def _append(self, ids, logp, own) -> None:
    if len(ids):
      self._ids.append(np.asarray(ids, np.int32))
      self._logp.append(np.asarray(logp, np.float32))
      self._own.append(own)
      self.length += len(ids)
      self._tokens_cache = None

  def tokens(self) -> np.ndarray:
    if self._tokens_cache is None:
      self._tokens_cache = (
          np.concatenate(self._ids) if self._ids else np.zeros(0, np.int32)
      )
    return self._tokens_cache

  def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens, own-action mask, behaviour log-probs), each [length]."""
    if not self._ids:
      return np.zeros(0, np.int32), np.zeros(0, bool), np.zeros(0, np.float32)
    own = np.concatenate(
        [np.full(len(c), o) for c, o in zip(self._ids, self._own)]
    )
    return self.tokens(), own, np.concatenate(self._logp)


def make_renderers(
    tokenizers: Sequence[Any],
    chat_templates: Sequence[str | None] | None,
    *,
    system_prompt: str | None,
    agent_tag: str,
    env_tag: str,
    share: bool = True,
) -> list[Renderer]:
  """One renderer per agent; with `share`, equal renderers are one object."""
  if chat_templates is None:
    chat_templates = [None] * len(tokenizers)
  if len(chat_templates) != len(tokenizers):
    raise ValueError(
        f"{len(chat_templates)} chat templates for {len(tokenizers)} agents"
    )
  out: list[Renderer] = []
  by_key: dict[tuple, Renderer] = {}
  for k, (tok, template) in enumerate(zip(tokenizers, chat_templates)):
    r = Renderer(
        tok,
        chat_template=template,
        system_prompt=system_prompt,
        agent_tag=agent_tag,
        env_tag=env_tag,
        name=f"agent {k}",
    )
    if share:
      r = by_key.setdefault(r.share_key(), r)
    out.append(r)
  return out
