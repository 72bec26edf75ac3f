"""The load of tests/fairness/tokens.sh: a heavy client keeps two requests with 100k-token
prompts in flight while three chat clients each send short streamed chats one after another;
prints the chat clients' time to first token percentiles and the heavy client's throughput. Each
client names itself with `x-sparkgate-client` (its fair-queue share). Arguments: port, model,
seconds, the run's label, and how many requests the heavy client keeps in flight (2; 0: none)."""
import asyncio, json, sys, time

import httpx

port, model, seconds, label = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4]
# Requests the heavy client keeps in flight (0: the chats alone).
heavies = int(sys.argv[5]) if len(sys.argv) > 5 else 2
URL = f"http://127.0.0.1:{port}/v1/chat/completions"
# About 100 000 prompt tokens (" the" is one token of vllm-sim's vocabulary).
LONG = "the " * 100_000


async def heavy(client, until, done):
    while time.monotonic() < until:
        # A fresh first word: no prompt shares a prefix with another (no prefix-cache hits).
        body = {"model": model, "messages": [{"role": "user", "content": f"{time.monotonic_ns()} " + LONG}],
                "max_tokens": 16, "chat_template_kwargs": {"enable_thinking": False}}
        r = await client.post(URL, json=body, headers={"x-sparkgate-client": "heavy"}, timeout=900)
        assert r.status_code == 200, (r.status_code, r.text[:300])
        if time.monotonic() < until:
            done.append(r.json()["usage"]["prompt_tokens"])


async def chat(client, who, until, ttfts):
    n = 0
    while time.monotonic() < until:
        n += 1
        body = {"model": model, "messages": [{"role": "user", "content": f"{who} asks question {n}."}],
                "max_tokens": 16, "stream": True, "chat_template_kwargs": {"enable_thinking": False}}
        started = time.monotonic()
        first = None
        async with client.stream("POST", URL, json=body, headers={"x-sparkgate-client": who}, timeout=900) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if first is None and line.startswith("data: ") and '"content"' in line:
                    first = time.monotonic() - started
        if time.monotonic() < until and first is not None:
            ttfts.append(first)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round((len(xs) - 1) * q))] if xs else float("nan")


async def main():
    limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
    async with httpx.AsyncClient(limits=limits) as client:
        until = time.monotonic() + seconds
        prompts, ttfts = [], []
        tasks = [asyncio.create_task(heavy(client, until, prompts)) for _ in range(heavies)]
        if heavies:
            await asyncio.sleep(0.5)
        tasks += [asyncio.create_task(chat(client, f"chat-{i}", until, ttfts)) for i in range(3)]
        await asyncio.gather(*tasks)
    print(json.dumps({
        "run": label, "seconds": seconds,
        "chats": len(ttfts), "chat_ttft_p50_s": round(pct(ttfts, 0.5), 3), "chat_ttft_p95_s": round(pct(ttfts, 0.95), 3),
        "chat_ttft_p99_s": round(pct(ttfts, 0.99), 3), "chat_ttft_max_s": round(max(ttfts, default=float("nan")), 3),
        "heavy_requests": len(prompts), "heavy_prompt_tokens_per_s": round(sum(prompts) / seconds),
    }))


asyncio.run(main())
