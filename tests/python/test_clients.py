"""Real OpenAI clients through sparkgate: the `openai` SDK (sync and async, streaming and not,
tools, extra_body, error classes) and the `openai-agents` framework completing a tool-using turn.

Run by tests/tests/gateway_clients.rs with:
  SPARKGATE_BASE_URL   the gateway's /v1 base URL (instant simulator behind it)
  SPARKGATE_TIGHT_URL  a gateway with QUEUE_DEPTH=0 in front of a slow simulator (MAX_NUM_SEQS 2)
  SPARKGATE_MODEL      the served model name
"""

import asyncio
import json
import os
import unittest

import openai
from openai import AsyncOpenAI, OpenAI

BASE = os.environ["SPARKGATE_BASE_URL"]
TIGHT = os.environ["SPARKGATE_TIGHT_URL"]
MODEL = os.environ["SPARKGATE_MODEL"]
SMOKE = [{"role": "user", "content": "What is 17*19? Reply with the integer only."}]
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def client(url=BASE):
    return OpenAI(base_url=url, api_key="unused", max_retries=0)


def reasoning_of(message):
    extra = message.model_extra or {}
    return extra.get("reasoning") or extra.get("reasoning_content")


class SyncClient(unittest.TestCase):
    def test_non_streaming_smoke(self):
        r = client().chat.completions.create(model=MODEL, messages=SMOKE, max_tokens=32, temperature=0, extra_body=NO_THINK)
        self.assertEqual(r.choices[0].message.content, "323")
        self.assertIsNone(reasoning_of(r.choices[0].message))
        self.assertEqual(r.choices[0].finish_reason, "stop")
        self.assertEqual(r.usage.completion_tokens, 1)

    def test_streaming(self):
        stream = client().chat.completions.create(model=MODEL, messages=SMOKE, stream=True, extra_body=NO_THINK)
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(text, "323")
        self.assertEqual(chunks[-1].choices[0].finish_reason, "stop")
        self.assertTrue(all(c.usage is None for c in chunks), "no usage chunk the client did not ask for")

    def test_streaming_with_usage(self):
        stream = client().chat.completions.create(
            model=MODEL, messages=SMOKE, stream=True, stream_options={"include_usage": True}, extra_body=NO_THINK
        )
        chunks = list(stream)
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, 1)

    def test_extra_body_effort_reaches_the_template(self):
        r = client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=200,
            extra_body={"chat_template_kwargs": {"reasoning_effort": 33}},
        )
        self.assertTrue(reasoning_of(r.choices[0].message).startswith("Reasoning Effort: 33"))
        r = client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=200, reasoning_effort="medium"
        )
        self.assertTrue(reasoning_of(r.choices[0].message).startswith("Reasoning Effort: 75"), "medium maps to high")

    def test_tools(self):
        r = client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Call get_weather for Paris."}], tools=[WEATHER], extra_body=NO_THINK
        )
        call = r.choices[0].message.tool_calls[0]
        self.assertEqual(r.choices[0].finish_reason, "tool_calls")
        self.assertEqual(call.function.name, "get_weather")
        self.assertEqual(json.loads(call.function.arguments), {"city": "Paris"})

    def test_responses_api(self):
        r = client().responses.create(model=MODEL, input="What is 17*19? Reply with the integer only.", reasoning={"effort": "none"})
        self.assertEqual(r.output_text, "323")

    def test_errors_raise_the_right_classes(self):
        with self.assertRaises(openai.NotFoundError) as e:
            client().chat.completions.create(model="gpt-4", messages=SMOKE)
        self.assertIn("does not exist", str(e.exception))
        with self.assertRaises(openai.BadRequestError) as e:
            client().chat.completions.create(model=MODEL, messages=SMOKE, reasoning_effort="extreme")
        self.assertEqual(e.exception.body.get("param"), "reasoning_effort")
        with self.assertRaises(openai.BadRequestError):
            client().chat.completions.create(model=MODEL, messages=SMOKE, extra_body={"extra_body": "not an object"})
        tight = client(TIGHT)
        holders = [
            tight.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True, max_tokens=2000, extra_body={"ignore_eos": True}
            )
            for _ in range(2)
        ]
        for h in holders:
            next(iter(h))
        try:
            with self.assertRaises(openai.RateLimitError) as e:
                tight.chat.completions.create(model=MODEL, messages=SMOKE)
            self.assertEqual(e.exception.response.headers.get("retry-after"), "2")
        finally:
            for h in holders:
                h.close()


class AsyncClient(unittest.TestCase):
    def test_async_stream_and_non_stream(self):
        async def run():
            c = AsyncOpenAI(base_url=BASE, api_key="unused", max_retries=0)
            r = await c.chat.completions.create(model=MODEL, messages=SMOKE, extra_body=NO_THINK)
            stream = await c.chat.completions.create(model=MODEL, messages=SMOKE, stream=True, extra_body=NO_THINK)
            text = ""
            async for chunk in stream:
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
            many = await asyncio.gather(*[
                c.chat.completions.create(model=MODEL, messages=SMOKE, extra_body=NO_THINK) for _ in range(8)
            ])
            await c.close()
            return r.choices[0].message.content, text, [m.choices[0].message.content for m in many]

        content, streamed, many = asyncio.run(run())
        self.assertEqual(content, "323")
        self.assertEqual(streamed, "323")
        self.assertEqual(many, ["323"] * 8)


class Agent(unittest.TestCase):
    def test_openai_agents_tool_turn(self):
        from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

        set_tracing_disabled(True)
        calls = []

        @function_tool
        def get_weather(city: str) -> str:
            """Current weather for a city."""
            calls.append(city)
            return f"sunny, 21 degrees in {city}"

        async def run():
            c = AsyncOpenAI(base_url=BASE, api_key="unused", max_retries=0)
            agent = Agent(
                name="weather",
                instructions="Answer weather questions with the tool.",
                tools=[get_weather],
                model=OpenAIChatCompletionsModel(model=MODEL, openai_client=c),
            )
            result = await Runner.run(agent, "Use get_weather to tell me the weather in Paris.")
            await c.close()
            return result.final_output

        final = asyncio.run(run())
        self.assertEqual(calls, ["Paris"], "the agent called the tool through the gateway")
        self.assertIn("sunny, 21 degrees in Paris", final)


if __name__ == "__main__":
    unittest.main(verbosity=2)
