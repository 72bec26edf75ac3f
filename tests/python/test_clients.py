"""Real clients through sparkgate: the `openai` SDK (sync and async, streaming and not, tools,
extra_body, structured output, the Responses API, error classes), `openai-agents` on chat
completions and on Responses, `langchain-openai`, `pydantic-ai` (tool and native structured
output), the `anthropic` SDK on `/v1/messages` (plain, streaming, tools) and the `litellm` SDK
as a `hosted_vllm/` model (chat, stream, tools, `reasoning_effort`, `response_format` and
`litellm.responses`, which LiteLLM bridges to chat completions with `tools: []`).

Run by tests/tests/gateway_clients.rs, once in front of vllm-sim and once in front of the real
vLLM 0.33.0 frontend (tests/realvllm), with:
  SPARKGATE_BASE_URL   the gateway's /v1 base URL
  SPARKGATE_TIGHT_URL  a gateway with QUEUE_DEPTH=0 in front of a backend slow enough to hold
                       its MAX_NUM_SEQS (2) streams
  SPARKGATE_MODEL      the served model name
"""

import asyncio
import json
import os
import unittest

import openai
import pydantic
from openai import AsyncOpenAI, OpenAI

BASE = os.environ["SPARKGATE_BASE_URL"]
TIGHT = os.environ["SPARKGATE_TIGHT_URL"]
MODEL = os.environ["SPARKGATE_MODEL"]
SMOKE = [{"role": "user", "content": "What is 17*19? Reply with the integer only."}]
ROOT = BASE.removesuffix("/v1")
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


class City(pydantic.BaseModel):
    name: str
    population: int


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
        self.assertGreaterEqual(r.usage.completion_tokens, 1)

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
        self.assertGreaterEqual(chunks[-1].usage.completion_tokens, 1)

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

    def test_responses_chain_retrieve_items_delete(self):
        # The gateway's store (docs/store.md): a chain by previous_response_id, read back,
        # listed and deleted with the SDK's own calls.
        c = client()
        first = c.responses.create(model=MODEL, input="What is 17*19? Reply with the integer only.", reasoning={"effort": "none"})
        second = c.responses.create(model=MODEL, input="And 18*19?", previous_response_id=first.id, reasoning={"effort": "none"})
        self.assertEqual(second.previous_response_id, first.id)
        self.assertEqual(c.responses.retrieve(second.id).id, second.id)
        items = list(c.responses.input_items.list(second.id, order="asc"))
        users = [i for i in items if getattr(i, "role", None) == "user"]
        self.assertEqual(len(users), 2, items)
        c.responses.delete(second.id)
        with self.assertRaises(openai.NotFoundError):
            c.responses.retrieve(second.id)
        with self.assertRaises(openai.NotFoundError):
            c.responses.create(model=MODEL, input="more", previous_response_id=second.id)

    def test_structured_output_parses(self):
        r = client().chat.completions.parse(
            model=MODEL, messages=[{"role": "user", "content": "Name a city and its population."}], response_format=City
        )
        city = r.choices[0].message.parsed
        self.assertIsInstance(city, City)
        self.assertIsInstance(city.population, int)

    def test_responses_stream(self):
        with client().responses.stream(model=MODEL, input="Explain hash maps.", max_output_tokens=300) as stream:
            kinds = [e.type for e in stream]
            final = stream.get_final_response()
        self.assertEqual(kinds[0], "response.created")
        self.assertIn("response.output_text.delta", kinds)
        self.assertIn(final.status, ("completed", "incomplete"))
        self.assertTrue(final.output_text)

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


def agent_weather_turn(model_class, weather):
    """One openai-agents run with a weather tool on `model_class` (chat or Responses); returns
    the cities the tool was called with and the final output."""
    from agents import Agent, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    calls = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        calls.append(city)
        return f"{weather} in {city}"

    async def run():
        c = AsyncOpenAI(base_url=BASE, api_key="unused", max_retries=0)
        agent = Agent(
            name="weather",
            instructions="Answer weather questions with the tool.",
            tools=[get_weather],
            model=model_class(model=MODEL, openai_client=c),
        )
        result = await Runner.run(agent, "Use get_weather to tell me the weather in Paris.")
        await c.close()
        return result.final_output

    return calls, asyncio.run(run())


class Agent(unittest.TestCase):
    def test_openai_agents_tool_turn(self):
        from agents import OpenAIChatCompletionsModel

        calls, final = agent_weather_turn(OpenAIChatCompletionsModel, "sunny, 21 degrees")
        self.assertEqual(calls, ["Paris"], "the agent called the tool through the gateway")
        self.assertIn("sunny, 21 degrees in Paris", final)

    def test_openai_agents_on_the_responses_api(self):
        from agents import OpenAIResponsesModel

        calls, final = agent_weather_turn(OpenAIResponsesModel, "rain, 9 degrees")
        self.assertEqual(calls, ["Paris"])
        self.assertIn("rain, 9 degrees in Paris", final)


    def test_openai_agents_with_server_side_conversation_state(self):
        from agents import Agent as SdkAgent
        from agents import OpenAIResponsesModel, Runner, set_tracing_disabled

        set_tracing_disabled(True)

        async def run():
            c = AsyncOpenAI(base_url=BASE, api_key="unused", max_retries=0)
            agent = SdkAgent(
                name="chat", instructions="Answer briefly.", model=OpenAIResponsesModel(model=MODEL, openai_client=c)
            )
            first = await Runner.run(agent, "What is 17*19? Reply with the integer only.")
            second = await Runner.run(agent, "Say it again.", previous_response_id=first.last_response_id)
            stored = await c.responses.retrieve(second.last_response_id)
            await c.close()
            return first, second, stored

        first, second, stored = asyncio.run(run())
        self.assertTrue(second.final_output)
        self.assertEqual(stored.previous_response_id, first.last_response_id)


class LangChain(unittest.TestCase):
    def llm(self):
        from langchain_openai import ChatOpenAI

        return ChatOpenAI(base_url=BASE, api_key="unused", model=MODEL, max_retries=0)

    def test_invoke_and_stream(self):
        msg = self.llm().invoke("What is 17*19? Reply with the integer only.", extra_body=NO_THINK)
        self.assertEqual(msg.content, "323")
        streamed = "".join(c.content for c in self.llm().stream("What is 17*19? Reply with the integer only.", extra_body=NO_THINK))
        self.assertEqual(streamed, "323")

    def test_tools_and_structured_output(self):
        from langchain_core.tools import tool

        @tool
        def get_weather(city: str) -> str:
            """Current weather for a city."""
            return "sunny"

        msg = self.llm().bind_tools([get_weather]).invoke("Call get_weather for Paris.")
        self.assertEqual(msg.tool_calls[0]["name"], "get_weather")
        self.assertEqual(msg.tool_calls[0]["args"], {"city": "Paris"})
        city = self.llm().with_structured_output(City).invoke("Name a city and its population.")
        self.assertIsInstance(city, City)


class PydanticAI(unittest.TestCase):
    def model(self):
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider

        return OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=BASE, api_key="unused"))

    def test_structured_output_by_tool_and_native(self):
        from pydantic_ai import Agent, NativeOutput

        by_tool = Agent(self.model(), output_type=City).run_sync("Name a city and its population.")
        self.assertIsInstance(by_tool.output, City)
        native = Agent(self.model(), output_type=NativeOutput(City)).run_sync("Name a city and its population.")
        self.assertIsInstance(native.output, City)

    def test_tool_turn(self):
        from pydantic_ai import Agent

        agent = Agent(self.model(), instructions="Answer weather questions with the tool.")
        calls = []

        @agent.tool_plain
        def get_weather(city: str) -> str:
            """Current weather for a city."""
            calls.append(city)
            return f"fog, 4 degrees in {city}"

        result = agent.run_sync("Use get_weather to tell me the weather in Paris.")
        self.assertEqual(calls, ["Paris"])
        self.assertIn("fog, 4 degrees in Paris", result.output)


class Anthropic(unittest.TestCase):
    def client(self):
        import anthropic

        return anthropic.Anthropic(base_url=ROOT, api_key="unused", max_retries=0)

    def test_messages_plain_and_stream(self):
        smoke = "What is 17*19? Reply with the integer only."
        m = self.client().messages.create(
            model=MODEL, max_tokens=64, messages=[{"role": "user", "content": smoke}], thinking={"type": "disabled"}
        )
        self.assertEqual([b.type for b in m.content], ["text"])
        self.assertEqual(m.content[0].text, "323")
        self.assertEqual(m.stop_reason, "end_turn")
        with self.client().messages.stream(model=MODEL, max_tokens=400, messages=[{"role": "user", "content": "Explain hash maps."}]) as s:
            events = [e.type for e in s]
            final = s.get_final_message()
        self.assertEqual(events[0], "message_start")
        self.assertIn("content_block_delta", events)
        self.assertEqual(final.content[0].type, "thinking")

    def test_thinking_and_effort(self):
        prompt = [{"role": "user", "content": "Explain hash maps."}]
        thinking = self.client().messages.create(
            model=MODEL, max_tokens=2048, messages=prompt, thinking={"type": "enabled", "budget_tokens": 1024}
        )
        self.assertEqual(thinking.content[0].type, "thinking")
        # DeepSeek's encoder cannot render `medium`: the gateway maps it (REASONING_EFFORT_MAP).
        medium = self.client().messages.create(model=MODEL, max_tokens=600, messages=prompt, extra_body={"output_config": {"effort": "medium"}})
        self.assertTrue(medium.content[0].thinking.startswith("Reasoning Effort: 75"), medium.content[0])

    def test_tool_use(self):
        tools = [{"name": "get_weather", "description": "Current weather for a city",
                  "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
        m = self.client().messages.create(
            model=MODEL, max_tokens=600, tools=tools, messages=[{"role": "user", "content": "Call get_weather for Paris."}]
        )
        use = [b for b in m.content if b.type == "tool_use"]
        self.assertEqual(m.stop_reason, "tool_use")
        self.assertEqual((use[0].name, use[0].input), ("get_weather", {"city": "Paris"}))


class LiteLLM(unittest.TestCase):
    """LiteLLM speaking to vLLM as it does in the field: `hosted_vllm/<served name>`."""

    @classmethod
    def setUpClass(cls):
        # The bundled price map: importing litellm otherwise fetches one from GitHub.
        os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
        import litellm

        cls.litellm = litellm
        cls.args = {"model": f"hosted_vllm/{MODEL}", "api_base": BASE, "api_key": "unused", "num_retries": 0}

    def test_litellm_chat_and_stream(self):
        r = self.litellm.completion(messages=SMOKE, max_tokens=32, temperature=0, extra_body=NO_THINK, **self.args)
        self.assertEqual(r.choices[0].message.content, "323")
        chunks = self.litellm.completion(messages=SMOKE, max_tokens=32, stream=True, extra_body=NO_THINK, **self.args)
        self.assertEqual("".join(c.choices[0].delta.content or "" for c in chunks), "323")

    def test_litellm_tools(self):
        r = self.litellm.completion(
            messages=[{"role": "user", "content": "Call get_weather for Paris."}], tools=[WEATHER], extra_body=NO_THINK, **self.args
        )
        call = r.choices[0].message.tool_calls[0]
        self.assertEqual(call.function.name, "get_weather")
        self.assertEqual(json.loads(call.function.arguments), {"city": "Paris"})

    def test_litellm_reasoning_effort_and_response_format(self):
        r = self.litellm.completion(messages=SMOKE, max_tokens=32, reasoning_effort="none", **self.args)
        self.assertEqual(r.choices[0].message.content, "323")
        r = self.litellm.completion(
            messages=[{"role": "user", "content": "Name a city and its population."}], response_format=City, **self.args
        )
        city = City.model_validate_json(r.choices[0].message.content)
        self.assertIsInstance(city.population, int)

    def test_litellm_responses_bridge(self):
        # LiteLLM sends `tools: []` with the bridged request; vLLM alone refuses it with 400.
        r = self.litellm.responses(input="What is 17*19? Reply with the integer only.", reasoning={"effort": "none"}, **self.args)
        text = "".join(c.text for item in r.output if getattr(item, "content", None) for c in item.content if hasattr(c, "text"))
        self.assertEqual(text, "323")


if __name__ == "__main__":
    unittest.main(verbosity=2)
