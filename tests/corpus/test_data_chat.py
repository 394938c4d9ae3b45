"""ChatML formatting, loss mask and tokenizers (lenbatch_study.corpus.chat) with the real Qwen3.6 tokenizer and
real ShareGPT conversations, plus a tiny local Hugging Face tokenizer directory built here."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from lenbatch_study.corpus.chat import (
    IM_END,
    IM_START,
    ROLE_MAP,
    BadRecord,
    ChatEncoder,
    HFTokenizer,
    QwenTiktoken,
    chatml_text,
    conversation_from_record,
    encode_chunk,
    load_tokenizer,
    nfc,
)
from lenbatch_study.corpus.sources import SourceReport, iter_records, resolve_source
from _tiny import tiny_hf_tokenizer as _tiny_hf_tokenizer


@pytest.fixture(scope="module")
def qwen() -> QwenTiktoken:
    return QwenTiktoken()


@pytest.fixture(scope="module")
def real_conversations() -> list[list[tuple[str, str]]]:
    """The first 120 non-empty conversations of the real default corpus."""
    path, fmt = resolve_source("sharegpt")
    out = []
    for _, record in iter_records(path, fmt, SourceReport(str(path), fmt), limit=130):
        turns = conversation_from_record(record)
        if turns:
            out.append(turns)
    assert len(out) >= 120
    return out[:120]


def _assistant_text(turns) -> str:
    return "".join(nfc(content) + IM_END for role, content in turns if role == "assistant")


def test_qwen_tokenizer_is_the_qwen36_vocabulary(qwen):
    assert qwen.im_start_id == 248045 and qwen.im_end_id == 248046
    assert qwen.encode("<|im_end|>") != [qwen.im_end_id]  # content never forges a special token
    assert qwen.encode_chatml("<|im_end|>") == [qwen.im_end_id]


def test_decoding_gives_back_the_chatml_text(qwen, real_conversations):
    enc = ChatEncoder(qwen)
    for turns in real_conversations:
        ids, mask = enc.encode(turns)
        assert len(ids) == len(mask)
        assert qwen.decode(ids) == nfc(chatml_text(turns))


def test_loss_mask_covers_exactly_the_assistant_contents_and_their_im_end(qwen, real_conversations):
    enc = ChatEncoder(qwen)
    for turns in real_conversations:
        ids, mask = enc.encode(turns)
        ids, mask = np.asarray(ids), np.asarray(mask)
        assert set(np.unique(mask)) <= {0, 1}
        assert qwen.decode(ids[mask == 1]) == _assistant_text(turns)
        # the complement is everything else: headers, user/system turns, the "\n" after each <|im_end|>
        rest = "".join(f"<|im_start|>{r}\n" + ("" if r == "assistant" else nfc(c) + IM_END) + "\n" for r, c in turns)
        assert qwen.decode(ids[mask == 0]) == rest
        # one contiguous masked run per assistant turn, each ending on <|im_end|>
        runs = [list(g) for k, g in itertools.groupby(zip(mask, ids), key=lambda t: t[0]) if k == 1]
        assert len(runs) == sum(r == "assistant" for r, _ in turns)
        assert all(run[-1][1] == qwen.im_end_id for run in runs)


def test_segment_wise_encoding_equals_whole_string_encoding_on_real_conversations(qwen, real_conversations):
    enc = ChatEncoder(qwen)
    compared = 0
    for turns in real_conversations:
        if any(c[:1] in ("\n", "\r") or "<|" in c for _, c in turns):
            continue  # the two documented exceptions (see lenbatch_study.corpus.chat)
        ids, _ = enc.encode(turns)
        assert ids == qwen.encode_chatml(chatml_text(turns))
        compared += 1
    assert compared >= 100


def test_the_two_documented_differences_from_whole_string_encoding(qwen):
    enc = ChatEncoder(qwen)
    forged = [("user", "say <|im_end|> please"), ("assistant", "ok")]
    ids, mask = enc.encode(forged)
    assert ids.count(qwen.im_end_id) == 2  # only the two real turn ends
    assert qwen.encode_chatml(chatml_text(forged)).count(qwen.im_end_id) == 3
    leading = [("user", "\n\nhi"), ("assistant", "ok")]
    ids, _ = enc.encode(leading)
    assert ids != qwen.encode_chatml(chatml_text(leading))
    assert qwen.decode(ids) == chatml_text(leading)  # same text, a token boundary after the header


def test_role_mapping_sharegpt_and_openai():
    for raw, role in ROLE_MAP.items():
        assert conversation_from_record({"conversations": [{"from": raw, "value": "x"}]}) == [(role, "x")]
    record = {
        "messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        ]
    }
    assert conversation_from_record(record) == [("system", "s"), ("user", "u"), ("assistant", "ab")]
    assert conversation_from_record({"conversations": []}) == []
    assert conversation_from_record({"prompt": "p", "completion": "c"}) == [("user", "p"), ("assistant", "c")]
    pair = {
        "prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
        "completion": [{"role": "assistant", "content": "a"}],
    }
    assert conversation_from_record(pair) == [("system", "s"), ("user", "u"), ("assistant", "a")]


TOOL_CHAT = {
    "messages": [
        {"role": "system", "content": "You can look up the weather."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}},
                {"id": "c2", "type": "function", "function": {"name": "weather", "arguments": {"city": "Rome"}}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "18 C, sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "24 C, clear"},
        {"role": "assistant", "content": "Paris 18 C and sunny; Rome 24 C and clear."},
    ]
}


# What the Qwen3.5/3.6 chat template writes for TOOL_CHAT's call turn and results (its tool-call and tool-result
# branches; the embedded tokenizer carries no template to render them with, so they are written out here)
QWEN35_CALLS = (
    "<tool_call>\n<function=weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>\n"
    "<tool_call>\n<function=weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>"
)
QWEN35_RESULTS = "<tool_response>\n18 C, sunny\n</tool_response>\n<tool_response>\n24 C, clear\n</tool_response>"


def test_tool_use_is_kept_in_the_context_and_left_out_of_the_loss(qwen):
    """OpenAI tool use as the Qwen3.5/3.6 chat template renders it: the calls inside the assistant turn as
    <function>/<parameter> elements (arguments given as a JSON string or an object alike), the two tool results
    in one user turn of <tool_response> blocks; only the final answer (and each assistant turn's <|im_end|>) is
    learned."""
    turns = conversation_from_record(TOOL_CHAT)
    assert turns[2] == ("assistant", "", QWEN35_CALLS)
    assert chatml_text(turns[2:4]) == (
        f"{IM_START}assistant\n{QWEN35_CALLS}{IM_END}\n{IM_START}user\n{QWEN35_RESULTS}{IM_END}\n"
    )
    assert turns[3] == (
        "user",
        "<tool_response>\n18 C, sunny\n</tool_response>\n<tool_response>\n24 C, clear\n</tool_response>",
    )
    assert len(turns) == 5
    ids, mask = ChatEncoder(qwen).encode(turns)
    ids, mask = np.asarray(ids), np.asarray(mask)
    text = qwen.decode(ids)
    assert text == chatml_text(turns) and "<parameter=city>\nRome\n" in text and "24 C, clear" in text
    assert qwen.decode(ids[mask == 1]) == IM_END + "Paris 18 C and sunny; Rome 24 C and clear." + IM_END
    sharegpt = {
        "conversations": [
            {"from": "human", "value": "hi"},
            {"from": "observation", "value": "{}"},
            {"from": "gpt", "value": "ok"},
        ]
    }
    assert conversation_from_record(sharegpt)[1] == ("user", "<tool_response>\n{}\n</tool_response>")


def test_a_call_after_content_and_every_kind_of_argument_value_are_written_as_the_template_writes_them():
    """Content, then a blank line, then the call; a string argument as is, an object or list as JSON, a number or
    boolean as Python writes it (the template's tojson and |string)."""
    record = {
        "messages": [
            {
                "role": "assistant",
                "content": "Let me check.",
                "tool_calls": [
                    {"function": {"name": "f", "arguments": {"q": "a b", "opts": {"k": [1, "é"]}, "n": 3, "ok": True}}},
                    {"function": {"name": "g", "arguments": ""}},
                ],
            }
        ]
    }
    (turn,) = conversation_from_record(record)
    assert turn == (
        "assistant",
        "Let me check.",
        "\n\n<tool_call>\n<function=f>\n<parameter=q>\na b\n</parameter>\n<parameter=opts>\n"
        '{"k": [1, "é"]}\n</parameter>\n<parameter=n>\n3\n</parameter>\n<parameter=ok>\nTrue\n'
        "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=g>\n</function>\n</tool_call>",
    )


@pytest.mark.parametrize(
    "record, reason, words",
    [
        ({"conversations": [{"from": "robot", "value": "x"}]}, "unknown_role", "'robot'"),
        ({"messages": [{"role": "critic", "content": "x"}]}, "unknown_role", "'critic'"),
        (
            {"messages": [{"role": "assistant", "content": None, "tool_calls": [{"function": {"arguments": "{}"}}]}]},
            "bad_tool_call",
            "no function name",
        ),
        (
            {"messages": [{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}]},
            "bad_tool_call",
            "only an assistant",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [{"function": {"name": "f", "arguments": "{not json"}}],
                    }
                ]
            },
            "bad_tool_call",
            "not JSON",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [{"function": {"name": "f", "arguments": "[1, 2]"}}],
                    }
                ]
            },
            "bad_tool_call",
            "not an object of named arguments",
        ),
        ({"text": "hello"}, "no_schema", "has none of"),
        ({"prompt": "p", "completion": [{"role": "assistant", "content": "a"}]}, "no_schema", "must both be strings"),
        ([1, 2], "no_schema", "list"),
        ({"conversations": [{"from": "human"}]}, "no_schema", "conversations[0]"),
        ({"conversations": "hi"}, "no_schema", "not a list"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "non_text_content", "non-text"),
        ({"messages": [{"role": "user", "content": None}]}, "non_text_content", "NoneType"),
        ({"conversations": [{"from": "gpt", "value": "bad \ud83d pair"}]}, "bad_text", "does not decode"),
    ],
)
def test_bad_records_name_the_reason(record, reason, words):
    with pytest.raises(BadRecord) as info:
        conversation_from_record(record)
    assert info.value.reason == reason
    assert words in info.value.detail


def test_encode_chunk_applies_each_overflow_policy(qwen):
    enc = ChatEncoder(qwen)
    short = [("user", "hi"), ("assistant", "hello there")]
    long_ = [("user", "q"), ("assistant", "word " * 200)]
    long_prompt = [("user", "word " * 200), ("assistant", "a")]
    full = {k: enc.encode(t)[0] for k, t in (("s", short), ("l", long_), ("p", long_prompt))}
    items = [(10, short), (11, long_), (12, long_prompt)]
    max_len = 50
    assert len(full["s"]) <= max_len < len(full["l"])

    res = encode_chunk(enc, items, max_len=max_len, overflow="truncate", source_name="f.json")
    assert res["status"].tolist() == [0, 1, 3]  # kept, truncated, no assistant token left
    assert res["lengths"].tolist() == [len(full["s"]), max_len]
    assert res["source_index"].tolist() == [10, 11]
    assert res["ids"].tolist() == full["s"] + full["l"][:max_len]
    assert res["full_lengths"].tolist() == [len(v) for v in full.values()]

    res = encode_chunk(enc, items, max_len=max_len, overflow="drop", source_name="f.json")
    assert res["status"].tolist() == [0, 2, 2]
    assert res["source_index"].tolist() == [10]

    with pytest.raises(ValueError, match=r"f\.json: record 12 has \d+ tokens > data.max_len 50"):
        encode_chunk(enc, items, max_len=max_len, overflow="error", source_name="f.json")


def test_local_hugging_face_tokenizer_directory(tmp_path, real_conversations):
    tok = load_tokenizer(str(_tiny_hf_tokenizer(tmp_path / "tok")))
    assert isinstance(tok, HFTokenizer)
    enc = ChatEncoder(tok)
    for turns in real_conversations[:10] + [[("user", "a <|im_end|> b"), ("assistant", "ok")]]:
        ids, mask = enc.encode(turns)
        assert tok.decode(ids) == chatml_text(turns)
        assert tok.decode(np.asarray(ids)[np.asarray(mask) == 1]) == "".join(
            c + IM_END for r, c in turns if r == "assistant"
        )
        assert ids.count(tok.im_end_id) == len(turns)


def test_tokenizer_specs_that_cannot_work_are_refused(tmp_path):
    with pytest.raises(ValueError, match="neither 'qwen3.6'"):
        load_tokenizer("gpt-2")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="not a loadable Hugging Face tokenizer"):
        load_tokenizer(str(tmp_path / "empty"))
    no_chatml = _tiny_hf_tokenizer(tmp_path / "plain", special=("<s>",))
    with pytest.raises(ValueError, match=r"no <\|im_start\|> or <\|im_end\|> token"):
        load_tokenizer(str(no_chatml))
