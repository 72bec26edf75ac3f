"""The reference fixture: vLLM's own `vllm serve` (0.33.0 or 0.34.0) with a fake engine core.

Usage: python fixture.py --profile deepseek|glm --workdir DIR -- serve MODEL [vllm flags...]

REAL (the PyPI package vllm==0.33.0 or 0.34.0, unmodified, in-process on VLLM_TARGET_DEVICE=cpu):
  the `vllm serve` argument parser and its validation, AsyncEngineArgs -> VllmConfig, uvicorn,
  every FastAPI router (OpenAI, Anthropic Messages, SageMaker /invocations, tokenize, metrics),
  pydantic request validation, the exception handlers and error envelopes, the renderers
  (DeepSeek V4.1's Python prompt encoder with its reasoning_effort checks; GLM's jinja
  template path), the reasoning and tool parsers (deepseek_v41; glm45 / glm47), structured-
  output validation (xgrammar compiles the schema), AsyncLLM's input processor (length and
  sampling checks) and output processor (detokenising, stop strings, n>1, aborts, usage,
  metrics), SSE framing, and the Prometheus metrics.
FAKED (what cannot exist here):
  - the engine core (`fake_core.FakeEngineCore`, swapped in at
    `EngineCoreClient.make_async_mp_client`): no GPU, no model; it schedules and emits tokens;
  - the model's words (`fake_model`): chosen from the rendered prompt, not sampled; a prompt
    that is a recent request's prompt followed by the start of that request's output continues
    that output token for token, as a model does at temperature 0 (a cut generation resumed);
  - the model directory (`model_dir`): a byte-level BPE trained offline on the fake model's
    sentences plus the profile's special and added tokens, a weightless LlamaForCausalLM
    config.json, and a stand-in chat template (GLM's reconstructed from the guide's rule;
    DeepSeek's unused by its Python encoder);
  - argv: the model path, `--chat-template` and a DFlash draft path point at the generated
    stand-ins, `--host/--port` at the fixture's loopback port, and `--quantization exl3` is
    dropped (EXL3 is a plugin of the deployment image, not in the stock package);
  - on 0.34, Triton reads as present during the CPU platform's config check
    (`allow_config_without_triton`: Triton is for the model runner the fake core replaces).
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")
# A GPU with Triton picks Model Runner V2, which the plan's speculation methods need; on this
# CPU machine vLLM would fall back to V1 and refuse dspark/dflash before serving.
os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "1")

# Flags whose value is a path that exists only inside the deployment image or on the nodes.
PLUGIN_ONLY = {"--quantization": {"exl3"}}


def rewrite(argv: list[str], model: str, template: str, draft: str, port: str) -> list[str]:
    """The plan's argv with stand-in paths and the fixture's port (see the docstring)."""
    out, i = [], 0
    assert argv[0] == "serve", "argv starts with `serve MODEL`"
    out += ["serve", model]
    i = 2
    while i < len(argv):
        flag = argv[i]
        value = argv[i + 1] if i + 1 < len(argv) else None
        if flag in PLUGIN_ONLY and value in PLUGIN_ONLY[flag]:
            i += 2
            continue
        if flag == "--chat-template":
            out += [flag, template]
        elif flag == "--host":
            out += [flag, "127.0.0.1"]
        elif flag == "--port":
            out += [flag, port]
        elif flag == "--speculative-config":
            spec = json.loads(value)
            if "model" in spec:
                spec["model"] = draft
            out += [flag, json.dumps(spec)]
        else:
            out.append(flag)
            i += 1
            continue
        i += 2
    return out


def install_fake_core(profile: str, tokenizer_path: str) -> None:
    from vllm.v1.engine import core_client

    import fake_core

    def make(vllm_config, executor_class, log_stats, *args, **kwargs):
        return fake_core.FakeEngineCore(vllm_config, profile, tokenizer_path)

    core_client.EngineCoreClient.make_async_mp_client = staticmethod(make)


def allow_config_without_triton() -> None:
    """0.34's x86 CPU platform refuses to build a VllmConfig without triton-cpu (0.33 only
    warned). Triton serves the CPU model runner, which the fake engine core replaces, so during
    that one check Triton reads as present, and reads as it is again after it."""
    from vllm import triton_utils
    from vllm.platforms import cpu

    check = cpu.CpuPlatform.check_and_update_config.__func__

    def check_with_triton(cls, vllm_config):
        had = triton_utils.HAS_TRITON
        triton_utils.HAS_TRITON = True
        try:
            return check(cls, vllm_config)
        finally:
            triton_utils.HAS_TRITON = had

    cpu.CpuPlatform.check_and_update_config = classmethod(check_with_triton)


def prepare(profile: str, workdir: str) -> tuple[str, dict, str]:
    import fake_model
    import model_dir

    model = os.path.join(workdir, "model")
    facts = model_dir.build(profile, model, fake_model.CORPUS)
    draft = os.path.join(workdir, "draft")
    model_dir.build(profile, draft, fake_model.CORPUS, draft=True)
    return model, facts, draft


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", choices=["deepseek", "glm"], required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--port", required=True)
    p.add_argument("argv", nargs=argparse.REMAINDER)
    a = p.parse_args()
    argv = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
    model, facts, draft = prepare(a.profile, a.workdir)
    argv = rewrite(argv, model, facts["template"], draft, a.port)
    print("fixture: vllm " + " ".join(argv), flush=True)
    install_fake_core(a.profile, os.path.join(model, "tokenizer.json"))
    allow_config_without_triton()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm"] + argv
    vllm_main()


if __name__ == "__main__":
    main()
