"""Writes vllm-<version>-kinds.json: for each model class behind the request bodies of the
routes vllm-sim serves, what the real frontend's pydantic does that its /openapi.json does not
say — the error for an input that is not a mapping, the tag a union adds to an error's
location, and whether unknown keys are refused. vllm-sim's schema validation reads it beside
the captured /openapi.json. Run with the vLLM venv's python:

    ~/.cache/vllm-<version>/bin/python tests/sim-schema/capture_kinds.py > tests/sim-schema/vllm-<version>-kinds.json
"""

import json
import sys
from typing import Union

import vllm
from pydantic import TypeAdapter, ValidationError
from pydantic.json_schema import GenerateJsonSchema
from vllm.entrypoints.anthropic.protocol import AnthropicCountTokensRequest, AnthropicMessagesRequest
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
from vllm.entrypoints.serve.tokenize.protocol import DetokenizeRequest, TokenizeChatRequest, TokenizeCompletionRequest

ROOTS = [ChatCompletionRequest, CompletionRequest, AnthropicMessagesRequest, AnthropicCountTokensRequest,
         ResponsesRequest, TokenizeCompletionRequest, TokenizeChatRequest, DetokenizeRequest]


def classes(schema, out):
    """Every model, typed dict and dataclass in a pydantic core schema."""
    if isinstance(schema, dict):
        if schema.get("type") in ("model", "typed-dict", "dataclass") and "cls" in schema:
            out.setdefault(schema["cls"], schema["type"])
        for key, value in schema.items():
            if key not in ("cls", "metadata", "serialization"):
                classes(value, out)
    elif isinstance(schema, (list, tuple)):
        for value in schema:
            classes(value, out)


def first_error(adapter, value):
    try:
        # FastAPI validates request bodies with from_attributes=True (fastapi/_compat).
        adapter.validate_python(value, from_attributes=True)
    except ValidationError as e:
        return e.errors(include_url=False)
    except Exception:  # a validator that raises its own error: nothing generic to record
        return None
    return []


def probe(cls):
    own = TypeAdapter(cls)
    errs = first_error(own, 3) or [{}]
    e = errs[0]
    tagged = first_error(TypeAdapter(Union[cls, int]), 3.5) or [{}]
    tag = next((str(x["loc"][0]) for x in tagged if x.get("loc") and x["type"] != "int_from_float"), None)
    extra = first_error(own, {"x_sparkgate_probe": 1}) or []
    return {
        "not_a_mapping": {"type": e.get("type"), "msg": e.get("msg"), "ctx": {k: str(v) for k, v in (e.get("ctx") or {}).items()}},
        "union_tag": tag,
        "forbids_extra": any(x["type"] == "extra_forbidden" for x in extra),
    }


class Recording(GenerateJsonSchema):
    """Notes which classes a JSON schema defines (the ones /openapi.json names)."""

    seen = set()

    def generate(self, schema, mode="validation"):
        out = super().generate(schema, mode)
        for core_ref, _mode in self.core_to_defs_refs:
            Recording.seen.add(str(core_ref).split(":")[0])
        return out


def in_openapi(cls):
    return f"{cls.__module__}.{cls.__qualname__}" in Recording.seen


def names(cls, found, clashes):
    qualified = (cls.__module__ + "." + cls.__qualname__).replace(".", "__")
    if cls.__name__ not in clashes:
        return [qualified, cls.__name__]
    # A bare name several classes share stands for the one the schema shows; where pydantic
    # merged equal schemas under one name (openai's `tool.X` model and `tool_param.X` typed
    # dict), for the model, which the request fields that reach it use.
    rivals = [c for c in found if c.__name__ == cls.__name__ and in_openapi(c)]
    chosen = next((c for c in rivals if found[c] == "model"), rivals[0] if rivals else None)
    return [qualified, cls.__name__] if chosen is cls else [qualified]


def main():
    found = {}
    for root in ROOTS:
        classes(root.__pydantic_core_schema__, found)
    for root in ROOTS:
        TypeAdapter(root).json_schema(mode="validation", schema_generator=Recording)
    bare = [c.__name__ for c in found]
    clashes = {n for n in bare if bare.count(n) > 1}
    out = {"vllm": vllm.__version__, "classes": {}}
    for cls in sorted(found, key=lambda c: (c.__module__, c.__qualname__)):
        facts = dict(probe(cls), kind=found[cls])
        for name in names(cls, found, clashes):
            out["classes"][name] = facts
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


main()
