"""Structured output against a running demo (argv[1]: its /v1 base URL, argv[2]: the model):
the openai SDK's `parse` and pydantic-ai with tool output and with native (json_schema) output.
Prints one line per client; exits non-zero when any result is not a valid City."""

import sys

import openai
import pydantic
from pydantic_ai import Agent, NativeOutput
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

BASE, MODEL = sys.argv[1], sys.argv[2]


class City(pydantic.BaseModel):
    name: str
    population: int


parsed = openai.OpenAI(base_url=BASE, api_key="unused", max_retries=0).chat.completions.parse(
    model=MODEL, messages=[{"role": "user", "content": "Name a city and its population."}], response_format=City
)
assert isinstance(parsed.choices[0].message.parsed, City), parsed
print("openai parse:", parsed.choices[0].message.parsed)
model = OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=BASE, api_key="unused"))
for label, output in [("pydantic-ai tool", City), ("pydantic-ai native", NativeOutput(City))]:
    result = Agent(model, output_type=output).run_sync("Name a city and its population.")
    assert isinstance(result.output, City), result.output
    print(f"{label}:", result.output)
