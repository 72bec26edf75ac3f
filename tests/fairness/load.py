"""The load of tests/fairness/run.sh: a burst client keeps 16 requests in flight, a lone client
sends one request every 2 s; prints the lone client's and the burst's latency percentiles.
Both send `x-sparkgate-client`, which names them for the fair queue (ignored under fifo); under
`priority` the lone client's requests also carry `X-Vllm-Priority: -1` (the burst's are 0)."""
import asyncio, json, sys, time

import httpx

port, model, seconds, policy = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4]
URL = f"http://127.0.0.1:{port}/v1/chat/completions"
BODY = {"model": model, "messages": [{"role": "user", "content": "Count to ten."}], "max_tokens": 32,
        "ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False}}


async def one(client: httpx.AsyncClient, who: str) -> float:
    started = time.monotonic()
    headers = {"x-sparkgate-client": who}
    if policy == "priority" and who == "lone":
        headers["X-Vllm-Priority"] = "-1"
    r = await client.post(URL, json=BODY, headers=headers, timeout=600)
    assert r.status_code == 200, (r.status_code, r.text)
    return time.monotonic() - started


async def burst(client, until, out):
    while time.monotonic() < until:
        out.append(await one(client, "burst"))


async def lone(client, until, out):
    while time.monotonic() < until:
        tick = time.monotonic()
        out.append(await one(client, "lone"))
        await asyncio.sleep(max(0.0, 2.0 - (time.monotonic() - tick)))


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round((len(xs) - 1) * q))] if xs else float("nan")


async def main():
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(limits=limits) as client:
        await one(client, "warm-up")
        until = time.monotonic() + seconds
        burst_lat, lone_lat = [], []
        tasks = [asyncio.create_task(burst(client, until, burst_lat)) for _ in range(16)]
        await asyncio.sleep(1.0)  # the burst's queue forms first
        await lone(client, until, lone_lat)
        await asyncio.gather(*tasks)
    alone = min(lone_lat + burst_lat)
    print(json.dumps({
        "policy": policy, "seconds": seconds,
        "lone_requests": len(lone_lat), "lone_p50_s": round(pct(lone_lat, 0.5), 3), "lone_p95_s": round(pct(lone_lat, 0.95), 3),
        "burst_requests": len(burst_lat), "burst_p50_s": round(pct(burst_lat, 0.5), 3), "burst_p95_s": round(pct(burst_lat, 0.95), 3),
        "fastest_s": round(alone, 3),
    }))


asyncio.run(main())
