"""Named keys as real SDKs meet them (tests/tests/keys_clients.rs): the openai and anthropic SDKs,
each with its own key, are answered and read their usage; once a key is over its tokens per
minute, each SDK raises its own RateLimitError (429) with the Retry-After the gateway sent.
Prints one JSON line: the usage each SDK read, and what the refusals carried.

with SPARKGATE_BASE_URL (the gateway's base, without /v1), SPARKGATE_MODEL.
"""

import json
import os

import anthropic
import openai

BASE = os.environ["SPARKGATE_BASE_URL"]
MODEL = os.environ["SPARKGATE_MODEL"]
ASK = [{"role": "user", "content": "Say hello."}]


def main():
    oa = openai.OpenAI(base_url=BASE + "/v1", api_key="sk-sdk-openai", max_retries=0)
    an = anthropic.Anthropic(base_url=BASE, api_key="sk-sdk-anthropic", max_retries=0)
    chat = oa.chat.completions.create(model=MODEL, messages=ASK, max_tokens=5)
    msg = an.messages.create(model=MODEL, messages=ASK, max_tokens=5)
    out = {
        "openai": [chat.usage.prompt_tokens, chat.usage.completion_tokens],
        "anthropic": [msg.usage.input_tokens, msg.usage.output_tokens],
    }
    try:
        oa.chat.completions.create(model=MODEL, messages=ASK, max_tokens=5)
        out["openai_refused"] = None
    except openai.RateLimitError as e:
        out["openai_refused"] = {"status": e.status_code, "retry_after": e.response.headers.get("retry-after"),
                                 "message": str(e)}
    try:
        an.messages.create(model=MODEL, messages=ASK, max_tokens=5)
        out["anthropic_refused"] = None
    except anthropic.RateLimitError as e:
        out["anthropic_refused"] = {"status": e.status_code, "retry_after": e.response.headers.get("retry-after"),
                                    "type": e.body.get("error", {}).get("type") if isinstance(e.body, dict) else None}
    print(json.dumps(out))


main()
