"""The replay of tests/affinity/run.sh: agent conversations of several turns each, run side by
side, each turn the whole history so far plus a tool's output, streamed, then a short pause. Prints the mean and p95
time to first token and the prefix-cache hit ratio (hit / queried prompt tokens over both
groups, from the gateway's /metrics, which labels each group's vLLM families)."""
import asyncio, json, re, sys, time

import httpx

port, model, routing = int(sys.argv[1]), sys.argv[2], sys.argv[3]
conversations, turns = int(sys.argv[4]), int(sys.argv[5])
# An agent's turn: a tool's output of this many words, then a pause while the next tool runs.
TURN_WORDS, THINK_S = 300, 0.5
BASE = f"http://127.0.0.1:{port}"
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi".split()


def system_prompt(kind: int) -> str:
    # Two long system prompts (about 1500 words each), each shared by half the conversations.
    words = [WORDS[(i * (kind + 3)) % len(WORDS)] for i in range(1500)]
    return f"You are agent {kind}. Follow these rules. " + " ".join(words)


async def turn(client, history):
    body = {"model": model, "messages": history, "max_tokens": 32, "ignore_eos": True, "stream": True,
            "chat_template_kwargs": {"enable_thinking": False}}
    started = time.monotonic()
    first, text = None, []
    async with client.stream("POST", f"{BASE}/v1/chat/completions", json=body, timeout=600) as r:
        assert r.status_code == 200, (r.status_code, await r.aread())
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"]
            if delta and delta[0]["delta"].get("content"):
                first = first or time.monotonic() - started
                text.append(delta[0]["delta"]["content"])
    return first, "".join(text)


async def conversation(client, i, ttfts):
    history = [{"role": "system", "content": system_prompt(i % 2)}]
    for t in range(turns):
        output = " ".join(WORDS[(i * 7 + t * 3 + k) % len(WORDS)] for k in range(TURN_WORDS))
        history.append({"role": "user", "content": f"Conversation {i}, turn {t}, tool output: {output}"})
        ttft, answer = await turn(client, history)
        ttfts.append(ttft)
        history.append({"role": "assistant", "content": answer})
        await asyncio.sleep(THINK_S)


def prefix_counts(text):
    total = {"queries": 0.0, "hits": 0.0}
    for line in text.splitlines():
        m = re.match(r"vllm:prefix_cache_(queries|hits)_total\{[^}]*\} ([0-9.e+]+)", line)
        if m:
            total[m.group(1)] += float(m.group(2))
    return total


async def main():
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=64)) as client:
        before = prefix_counts((await client.get(f"{BASE}/metrics")).text)
        ttfts = []
        started = time.monotonic()
        await asyncio.gather(*(conversation(client, i, ttfts) for i in range(conversations)))
        wall = time.monotonic() - started
        after = prefix_counts((await client.get(f"{BASE}/metrics")).text)
    queries = after["queries"] - before["queries"]
    hits = after["hits"] - before["hits"]
    ttfts.sort()
    mean = sum(ttfts) / len(ttfts)
    p95 = ttfts[min(len(ttfts) - 1, round((len(ttfts) - 1) * 0.95))]
    print(f"| {routing} | {len(ttfts)} | {100 * hits / queries:.1f} % | {mean * 1000:.0f} ms | {p95 * 1000:.0f} ms | {wall:.1f} s |")


asyncio.run(main())
