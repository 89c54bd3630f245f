"""Drive a running `ferrite serve` with the official openai and anthropic Python SDKs.

Run by crates/cli/tests/server_python.rs, which starts the server and sets
FERRITE_BASE_URL (http://host:port), FERRITE_MODEL and FERRITE_API_KEY. Prints one line
per check and a closing 'N passed, M failed' line; exits non-zero on any failure.
"""

import json
import os
import sys
import traceback
import urllib.request

import anthropic
import openai

BASE = os.environ["FERRITE_BASE_URL"]
MODEL = os.environ["FERRITE_MODEL"]
KEY = os.environ["FERRITE_API_KEY"]

oa = openai.OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0)
an = anthropic.Anthropic(base_url=BASE, api_key=KEY, max_retries=0)
MSGS = [{"role": "user", "content": "What is the capital of France?"}]
# Recent anthropic SDKs dropped `temperature` from create(); it still goes through extra_body.

results = []


def check(fn):
    try:
        fn()
        results.append((fn.__name__, None))
        print(f"ok   {fn.__name__}")
    except Exception:  # noqa: BLE001 - report every failure and go on
        results.append((fn.__name__, traceback.format_exc()))
        print(f"FAIL {fn.__name__}\n{traceback.format_exc()}")
    return fn


@check
def openai_models():
    ids = [m.id for m in oa.models.list()]
    assert MODEL in ids, ids


@check
def openai_chat_plain_equals_stream():
    r = oa.chat.completions.create(model=MODEL, messages=MSGS, temperature=0, max_tokens=12)
    text = r.choices[0].message.content
    assert isinstance(text, str) and text.strip(), r
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 0 and 0 < r.usage.completion_tokens <= 12
    assert isinstance(r.usage.prompt_tokens_details.cached_tokens, int)
    chunks = list(oa.chat.completions.create(model=MODEL, messages=MSGS, temperature=0, max_tokens=12,
                                             stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text, (streamed, text)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")


@check
def openai_chat_n_logprobs_stop():
    r = oa.chat.completions.create(model=MODEL, messages=MSGS, temperature=0.7, seed=1, n=2, max_tokens=4)
    assert len(r.choices) == 2 and {c.index for c in r.choices} == {0, 1}
    r = oa.chat.completions.create(model=MODEL, messages=MSGS, temperature=0, max_tokens=3,
                                   logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert len(content[0].top_logprobs) == 2 and content[0].logprob <= 0
    full = oa.chat.completions.create(model=MODEL, messages=MSGS, temperature=0, max_tokens=12)
    words = full.choices[0].message.content.split()
    if len(words) > 2:
        cut = oa.chat.completions.create(model=MODEL, messages=MSGS, temperature=0, max_tokens=12, stop=[words[2]])
        assert words[2] not in cut.choices[0].message.content
        assert cut.choices[0].finish_reason == "stop"


@check
def openai_completions():
    r = oa.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0)
    text = r.choices[0].text
    assert isinstance(text, str) and text
    streamed = "".join(c.choices[0].text for c in oa.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0, stream=True) if c.choices)
    assert streamed == text, (streamed, text)


@check
def openai_responses():
    r = oa.responses.create(model=MODEL, input="Name a fruit.", instructions="Answer briefly.",
                            max_output_tokens=8, temperature=0)
    assert r.output_text, r
    assert r.usage.input_tokens > 0
    deltas, final = [], None
    for ev in oa.responses.create(model=MODEL, input="Name a fruit.", instructions="Answer briefly.",
                                  max_output_tokens=8, temperature=0, stream=True):
        if ev.type == "response.output_text.delta":
            deltas.append(ev.delta)
        if ev.type in ("response.completed", "response.incomplete"):
            final = ev.response
    assert "".join(deltas) == r.output_text
    assert final is not None and final.output_text == r.output_text


def tokenize(text):
    """The one token id of `text`, from the server's /tokenize."""
    req = urllib.request.Request(BASE + "/tokenize", json.dumps({"content": text}).encode(),
                                 {"content-type": "application/json", "authorization": f"Bearer {KEY}"})
    ids = json.load(urllib.request.urlopen(req))["tokens"]
    assert len(ids) == 1, (text, ids)
    return ids[0]


@check
def openai_json_mode_and_logit_bias():
    r = oa.chat.completions.create(model=MODEL, temperature=0, max_tokens=100,
                                   messages=[{"role": "user", "content": "Describe a dog as JSON."}],
                                   response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "stop", r
    assert isinstance(json.loads(r.choices[0].message.content), dict), r
    try:
        oa.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=2, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {
                "type": "object",
                "properties": {"a": {"type": "array", "uniqueItems": True}}}}})
        raise AssertionError("a schema with 'uniqueItems' accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and "uniqueItems" in str(e), e
    best = oa.chat.completions.create(model=MODEL, messages=MSGS, temperature=0, max_tokens=1,
                                      logprobs=True, top_logprobs=2).choices[0].logprobs.content[0]
    token_id = tokenize(best.token)
    banned = oa.chat.completions.create(model=MODEL, messages=MSGS, temperature=0, max_tokens=1,
                                        logprobs=True, logit_bias={str(token_id): -100})
    assert banned.choices[0].logprobs.content[0].token == best.top_logprobs[1].token, banned


@check
def openai_structured_output_parses_into_pydantic_models():
    # The SDK turns the models into a strict schema ($defs and $ref, enums, a nullable
    # field) and pydantic validates the reply: an oracle independent of the server.
    import typing

    import pydantic

    class Pet(pydantic.BaseModel):
        name: str
        kind: typing.Literal["cat", "dog"]

    class Person(pydantic.BaseModel):
        name: str
        age: int
        pets: list[Pet]
        nickname: typing.Optional[str]

    parse = getattr(oa.chat.completions, "parse", None) or oa.beta.chat.completions.parse
    r = parse(model=MODEL, temperature=0, max_tokens=200, response_format=Person,
              messages=[{"role": "user", "content": "Ada is 36 and has a cat named Tom. As JSON."}])
    assert r.choices[0].finish_reason == "stop", r
    assert isinstance(r.choices[0].message.parsed, Person), r


@check
def openai_named_tool_choice_parses_into_a_pydantic_model():
    # A strict function tool made by the SDK from a model, forced by name: the SDK parses
    # the call's arguments into the model, and pydantic validates them.
    import typing

    import pydantic

    class GetWeather(pydantic.BaseModel):
        city: str
        unit: typing.Literal["c", "f"]

    parse = getattr(oa.chat.completions, "parse", None) or oa.beta.chat.completions.parse
    r = parse(model=MODEL, temperature=0, max_tokens=80,
              messages=[{"role": "user", "content": "Is it raining in Paris?"}],
              tools=[openai.pydantic_function_tool(GetWeather)],
              tool_choice={"type": "function", "function": {"name": "GetWeather"}})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", r
    call = choice.message.tool_calls[0].function
    assert call.name == "GetWeather", r
    assert isinstance(call.parsed_arguments, GetWeather), r


@check
def openai_errors():
    try:
        oa.chat.completions.create(model=MODEL, messages=[], max_tokens=2)
        raise AssertionError("empty messages accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400
    bad = openai.OpenAI(base_url=BASE + "/v1", api_key="wrong", max_retries=0)
    try:
        bad.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=2)
        raise AssertionError("wrong key accepted")
    except openai.AuthenticationError as e:
        assert e.status_code == 401
    try:
        oa.responses.create(model=MODEL, input="x", previous_response_id="resp_123")
        raise AssertionError("previous_response_id accepted")
    except openai.BadRequestError:
        pass


@check
def anthropic_messages_plain_equals_stream():
    kw = dict(model=MODEL, max_tokens=10, extra_body={"temperature": 0}, system="You are terse.",
              messages=[{"role": "user", "content": "Name a color."}])
    m = an.messages.create(**kw)
    text = m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens") and text
    with an.messages.stream(**kw) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == text, (streamed, text)
    assert final.content[0].text == text and final.stop_reason == m.stop_reason
    n = an.messages.count_tokens(model=MODEL, system="You are terse.",
                                 messages=[{"role": "user", "content": "Name a color."}])
    assert n.input_tokens == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)


@check
def anthropic_stop_sequences_and_errors():
    m = an.messages.create(model=MODEL, max_tokens=20, extra_body={"temperature": 0}, stop_sequences=["Paris"],
                           messages=MSGS)
    if m.stop_reason == "stop_sequence":
        assert m.stop_sequence == "Paris" and "Paris" not in m.content[0].text
    try:
        an.messages.create(model=MODEL, max_tokens=5, messages=[])
        raise AssertionError("empty messages accepted")
    except anthropic.BadRequestError as e:
        assert e.status_code == 400


@check
def anthropic_named_tool_choice_gives_a_tool_use_block():
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    m = an.messages.create(model=MODEL, max_tokens=80, extra_body={"temperature": 0},
                           messages=[{"role": "user", "content": "Is it raining in Paris?"}],
                           tools=[{"name": "get_weather", "input_schema": schema}],
                           tool_choice={"type": "tool", "name": "get_weather"})
    assert m.stop_reason == "tool_use", m
    uses = [b for b in m.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather", m
    assert set(uses[0].input) == {"city"} and isinstance(uses[0].input["city"], str), m


WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
ASK_WEATHER = [{"role": "user", "content": "Is it raining in Paris?"}]


@check
def openai_streamed_tool_arguments_add_up_to_the_plain_call():
    kw = dict(model=MODEL, temperature=0, max_tokens=80, messages=ASK_WEATHER,
              tools=[{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}],
              tool_choice={"type": "function", "function": {"name": "get_weather"}})
    call = oa.chat.completions.create(**kw).choices[0].message.tool_calls[0].function
    pieces = [tc.function.arguments
              for c in oa.chat.completions.create(stream=True, **kw) if c.choices
              for tc in (c.choices[0].delta.tool_calls or [])
              if tc.function and tc.function.arguments]
    # Streamed as generated: the arguments come in pieces that add up to the plain call.
    assert len(pieces) > 1, pieces
    assert "".join(pieces) == call.arguments, (pieces, call.arguments)
    assert isinstance(json.loads(call.arguments)["city"], str), call


@check
def anthropic_streamed_tool_input_adds_up_to_the_plain_block():
    kw = dict(model=MODEL, max_tokens=80, extra_body={"temperature": 0}, messages=ASK_WEATHER,
              tools=[{"name": "get_weather", "input_schema": WEATHER}],
              tool_choice={"type": "tool", "name": "get_weather"})
    plain = [b for b in an.messages.create(**kw).content if b.type == "tool_use"][0]
    with an.messages.stream(**kw) as s:
        pieces = [e.delta.partial_json for e in s
                  if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
        final = s.get_final_message()
    assert len(pieces) > 1, pieces
    assert json.loads("".join(pieces)) == plain.input, (pieces, plain.input)
    assert [b.input for b in final.content if b.type == "tool_use"] == [plain.input], final


@check
def openai_reasoning_effort_is_taken_and_checked():
    r = oa.chat.completions.create(model=MODEL, messages=MSGS, temperature=0, max_tokens=5,
                                   reasoning_effort="low")
    assert r.choices[0].message.content, r
    r = oa.responses.create(model=MODEL, input="Hi", max_output_tokens=5, reasoning={"effort": "high"})
    assert r.output_text, r
    try:
        oa.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=2, reasoning_effort="extreme")
        raise AssertionError("reasoning_effort 'extreme' accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and "reasoning_effort" in str(e), e


# Any model can be made to reason: a regex holds the output to a <think> block, then an answer.
THINK = {"structured_outputs": {"regex": "<think>[a-z]{2,12}</think>[A-Z][a-z ]{2,20}"}}


@check
def openai_reasoning_is_separated_plain_and_streamed():
    body = dict(THINK, thinking_token_budget=256, chat_template_kwargs={"enable_thinking": True})
    kw = dict(model=MODEL, messages=MSGS, temperature=0, max_tokens=40, extra_body=body)
    r = oa.chat.completions.create(**kw)
    m = r.choices[0].message
    reasoning = (m.model_extra or {}).get("reasoning_content")
    assert reasoning and "<think>" not in m.content and "</think>" not in m.content, m
    assert m.content.strip(), m
    chunks = list(oa.chat.completions.create(stream=True, **kw))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    streamed = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert streamed == reasoning, (streamed, reasoning)
    assert "".join(d.content or "" for d in deltas) == m.content


@check
def openai_responses_reasoning_item_and_token_count():
    r = oa.responses.create(model=MODEL, input="What is the capital of France?", temperature=0,
                            max_output_tokens=40, extra_body=dict(THINK, thinking_token_budget=256))
    kinds = [item.type for item in r.output]
    assert kinds[0] == "reasoning" and "message" in kinds, kinds
    assert r.usage.output_tokens_details.reasoning_tokens > 0, r.usage
    assert "<think>" not in r.output_text, r.output_text


@check
def anthropic_thinking_blocks_plain_and_streamed():
    kw = dict(model=MODEL, max_tokens=40, messages=MSGS, thinking={"type": "enabled", "budget_tokens": 1024},
              extra_body=dict(THINK, temperature=0))
    m = an.messages.create(**kw)
    assert [b.type for b in m.content] == ["thinking", "text"], m
    assert m.content[0].thinking and "<think>" not in m.content[1].text, m
    with an.messages.stream(**kw) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"], final
    assert final.content[0].thinking == m.content[0].thinking
    assert final.content[1].text == m.content[1].text
    # History with a thinking block is accepted, as the template expects it.
    history = [MSGS[0], {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "recall", "signature": ""}, {"type": "text", "text": "Paris."}]},
        {"role": "user", "content": "And of Italy?"}]
    m = an.messages.create(model=MODEL, max_tokens=5, messages=history, extra_body={"temperature": 0})
    assert m.content[0].type == "text", m


failed = [name for name, err in results if err]
print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
sys.exit(1 if failed else 0)
