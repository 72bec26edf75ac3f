"""A deterministic engine core in place of vLLM's: it receives the real `EngineCoreRequest`s
from `AsyncLLM` and answers with `EngineCoreOutputs`, like the engine-core process would.

Scheduling: FCFS, at most `--max-num-seqs` running, the rest waiting; a prompt longer than
`--max-num-batched-tokens` takes one step per chunk before its first token (those steps emit
nothing for it); then one token per running request per step. Stops follow vLLM's
`check_stop` order (eos unless ignore_eos, stop_token_ids, max_tokens / max_model_len), with
eos and stop tokens held back until `min_tokens` as vLLM's min-tokens logits processor does.
Logprobs are made up (sampled token first, rank 1). Each step also carries SchedulerStats so
the real metrics code observes running/waiting, prefix-cache queries and iteration tokens.
"""

import asyncio
import os
from collections import OrderedDict, deque
from types import SimpleNamespace

import numpy as np
from tokenizers import Tokenizer

from vllm.v1.engine import (
    EngineCoreEvent,
    EngineCoreEventType,
    EngineCoreOutput,
    EngineCoreOutputs,
    FinishReason,
)
from vllm.v1.metrics.stats import PrefillStats, PrefixCacheStats, SchedulerStats
from vllm.v1.outputs import LogprobsLists

import fake_model

STEP_S = float(os.environ.get("FAKE_STEP_S", "0.002"))


class Running:
    """One request inside the fake engine."""

    def __init__(self, req, planned: list[int], chunks: int):
        self.req = req
        self.sp = req.sampling_params
        self.planned = planned
        self.out: list[int] = []
        self.prefill_steps = chunks
        self.events = [EngineCoreEvent.new_event(EngineCoreEventType.QUEUED)]
        self.first = True


class FakeEngineCore:
    """Stands in for `AsyncMPClient`: the methods and attributes `AsyncLLM` uses."""

    def __init__(self, vllm_config, profile: str, tokenizer_path: str):
        self.max_num_seqs = vllm_config.scheduler_config.max_num_seqs
        self.max_batched = vllm_config.scheduler_config.max_num_batched_tokens
        self.max_model_len = vllm_config.model_config.max_model_len
        self.profile = profile
        self.tok = Tokenizer.from_file(tokenizer_path)
        self.eos = self.tok.token_to_id(fake_model_eos(profile))
        self.filler = self.tok.encode(" " + fake_model.prose("filler", 3)).ids
        self.waiting: deque[Running] = deque()
        self.running: "OrderedDict[str, Running]" = OrderedDict()
        self.outputs: asyncio.Queue = asyncio.Queue()
        self.wake = asyncio.Event()
        self.loop_task = None
        self.resources = SimpleNamespace(engine_dead=False)
        self.engine_ranks_managed = [0]
        self.queries = 0
        # (prompt ids, planned ids) of recent requests: a prompt that is one of them followed by
        # the start of its plan continues that plan, as a model does at temperature 0.
        self.memory: deque = deque(maxlen=256)

    # --- the client surface -------------------------------------------------------------

    async def add_request_async(self, req) -> None:
        ids = list(req.prompt_token_ids or [])
        if os.environ.get("FAKE_LOG_REQUESTS"):
            print(f"fake-core: request {req.request_id} structured={req.sampling_params.structured_outputs}", flush=True)
        planned = self._continuation(ids)
        if planned is None:
            prompt = self.tok.decode(ids, skip_special_tokens=False)
            text = fake_model.plan(prompt, self.profile, req.sampling_params.structured_outputs)
            planned = self.tok.encode(text).ids + [self.eos]
            self.memory.append((ids, planned))
        chunks = max(0, (len(req.prompt_token_ids or []) - 1) // max(1, self.max_batched))
        self.waiting.append(Running(req, planned, chunks))
        self._kick()

    def _continuation(self, ids: list[int]) -> list[int] | None:
        """The rest of a remembered plan when `ids` is its prompt plus the plan's first tokens."""
        for prompt, planned in reversed(self.memory):
            n = len(prompt)
            if n < len(ids) <= n + len(planned) and ids[:n] == prompt and ids[n:] == planned[: len(ids) - n]:
                return planned[len(ids) - n :]
        return None

    async def abort_requests_async(self, request_ids) -> None:
        ids = set(request_ids)
        self.waiting = deque(r for r in self.waiting if r.req.request_id not in ids)
        for rid in ids:
            self.running.pop(rid, None)

    async def get_output_async(self) -> EngineCoreOutputs:
        return await self.outputs.get()

    async def get_supported_tasks_async(self):
        return ("generate",)

    async def is_sleeping_async(self) -> bool:
        return False

    async def reset_prefix_cache_async(self, *args, **kwargs) -> bool:
        return True

    async def reset_mm_cache_async(self) -> None:
        return None

    async def reset_encoder_cache_async(self) -> None:
        return None

    async def collective_rpc_async(self, *args, **kwargs):
        return []

    async def get_weight_version_async(self):
        return None

    def get_kv_event_sources(self):
        return {}

    def dp_engines_running(self) -> bool:
        return bool(self.running or self.waiting)

    def shutdown(self, timeout=None) -> None:
        if self.loop_task is not None:
            self.loop_task.cancel()

    # --- the engine loop ----------------------------------------------------------------

    def _kick(self) -> None:
        if self.loop_task is None or self.loop_task.done():
            self.loop_task = asyncio.get_running_loop().create_task(self._loop())
        self.wake.set()

    async def _loop(self) -> None:
        while True:
            if not self.waiting and not self.running:
                self.wake.clear()
                await self.wake.wait()
                continue
            self.outputs.put_nowait(self._step())
            await asyncio.sleep(STEP_S)

    def _step(self) -> EngineCoreOutputs:
        cache = PrefixCacheStats()
        while self.waiting and len(self.running) < self.max_num_seqs:
            r = self.waiting.popleft()
            r.events.append(EngineCoreEvent.new_event(EngineCoreEventType.SCHEDULED))
            self.running[r.req.request_id] = r
            n = len(r.req.prompt_token_ids or [])
            cache.record(num_tokens=n, num_hits=0, preempted=False)
        outputs = []
        for rid, r in list(self.running.items()):
            if r.prefill_steps > 0:
                r.prefill_steps -= 1
                continue
            out = self._advance(r)
            outputs.append(out)
            if out.finish_reason is not None:
                del self.running[rid]
        stats = SchedulerStats(
            num_running_reqs=len(self.running),
            num_waiting_reqs=len(self.waiting),
            kv_cache_usage=min(1.0, 0.01 * len(self.running)),
            prefix_cache_stats=cache,
        )
        return EngineCoreOutputs(outputs=outputs, scheduler_stats=stats)

    def _next_token(self, r: Running) -> int:
        i = len(r.out)
        held = lambda t: (r.sp.ignore_eos and t == self.eos) or (
            i < r.sp.min_tokens and (t == self.eos or t in (r.sp.stop_token_ids or ()))
        )
        if i < len(r.planned) and not held(r.planned[i]):
            return r.planned[i]
        # Past the plan, or eos masked (min-tokens processor, ignore_eos): the model says more,
        # and ends as soon as it may.
        if i >= len(r.planned) and not held(self.eos):
            return self.eos
        return self.filler[i % len(self.filler)]

    def _advance(self, r: Running) -> EngineCoreOutput:
        tok = self._next_token(r)
        r.out.append(tok)
        finish, stop_reason = None, None
        n_prompt = len(r.req.prompt_token_ids or [])
        if tok == r.sp.eos_token_id:
            finish = FinishReason.STOP
        elif tok in (r.sp.stop_token_ids or ()):
            finish, stop_reason = FinishReason.STOP, tok
        elif n_prompt + len(r.out) >= self.max_model_len or len(r.out) >= r.sp.max_tokens:
            finish = FinishReason.LENGTH
        out = EngineCoreOutput(
            request_id=r.req.request_id,
            new_token_ids=[tok],
            new_logprobs=self._logprobs(r, tok),
            finish_reason=finish,
            stop_reason=stop_reason,
            events=r.events or None,
            # As vLLM's scheduler does: the request's trace context rides on its outputs, and
            # the frontend's output processor opens its `llm_request` span under it.
            trace_headers=r.req.trace_headers,
        )
        r.events = []
        if r.first:
            out.prefill_stats = PrefillStats(num_prompt_tokens=n_prompt, num_computed_tokens=n_prompt)
            r.first = False
        return out

    def _logprobs(self, r: Running, tok: int):
        k = r.sp.logprobs
        if k is None:
            return None
        k = max(0, k if k >= 0 else 5)
        vocab = self.tok.get_vocab_size()
        ids = [tok] + [(tok + j) % vocab for j in range(1, k + 1)]
        lps = [-0.125] + [-1.0 - j for j in range(k)]
        return LogprobsLists(
            np.array([ids], dtype=np.int32),
            np.array([lps], dtype=np.float32),
            np.array([1], dtype=np.int32),
        )


def fake_model_eos(profile: str) -> str:
    import model_dir

    return model_dir.PROFILES[profile]["eos"]
