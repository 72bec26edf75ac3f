"""A Responses conversation kept by the gateway's store, in two steps run by
tests/tests/store_clients.rs with a restart between them (of the rank group, or of the gateway):

  store_chain.py start            the openai SDK creates the first turn; prints its id
  store_chain.py continue ID      the SDK continues from ID; openai-agents continues from that
                                  (server-side conversation state) and asks what was said; the
                                  SDK retrieves, lists the input items and deletes

with SPARKGATE_BASE_URL (the gateway's /v1) and SPARKGATE_MODEL.
"""

import asyncio
import os
import sys

import openai
from openai import AsyncOpenAI, OpenAI

BASE = os.environ["SPARKGATE_BASE_URL"]
MODEL = os.environ["SPARKGATE_MODEL"]
ARGS = {"max_output_tokens": 400, "temperature": 0}


def start(c):
    r = c.responses.create(model=MODEL, input="Turn 1: remember the number 11.", **ARGS)
    print(r.id)


def recall_by_agent(previous):
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled

    set_tracing_disabled(True)

    async def run():
        ac = AsyncOpenAI(base_url=BASE, api_key="unused", max_retries=0)
        agent = Agent(
            name="recall",
            model=OpenAIResponsesModel(model=MODEL, openai_client=ac),
            model_settings=ModelSettings(temperature=0, max_tokens=400),
        )
        result = await Runner.run(agent, "Which numbers did I say?", previous_response_id=previous)
        await ac.close()
        return result

    return asyncio.run(run())


def carry_on(c, first):
    second = c.responses.create(model=MODEL, input="Turn 2: remember the number 22.", previous_response_id=first, **ARGS)
    assert second.previous_response_id == first, second
    result = recall_by_agent(second.id)
    assert result.final_output == "You said: 11, 22.", result.final_output
    last = result.last_response_id
    stored = c.responses.retrieve(last)
    assert stored.previous_response_id == second.id, stored
    items = list(c.responses.input_items.list(last, order="asc"))
    users = [i for i in items if getattr(i, "role", None) == "user"]
    assert len(users) == 3, items
    c.responses.delete(last)
    try:
        c.responses.retrieve(last)
        raise AssertionError("a deleted response was still there")
    except openai.NotFoundError:
        pass
    print("ok")


if __name__ == "__main__":
    client = OpenAI(base_url=BASE, api_key="unused", max_retries=0)
    if sys.argv[1] == "start":
        start(client)
    else:
        carry_on(client, sys.argv[2])
