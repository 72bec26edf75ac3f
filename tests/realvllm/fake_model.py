"""What the fake "model" says, decided from the rendered prompt the real frontend produced.

It answers the guides' smoke test (17*19 -> 323), reasons when the prompt opens a thinking
block and says which effort the template rendered ("Reasoning Effort: X"), calls a tool in the
profile's own syntax when the user names one of the offered tools, answers a tool result in
prose, writes output that satisfies a structured-output request (JSON schema, json_object,
choice, regex, structural tag), and otherwise writes deterministic prose seeded by the prompt.
"""

import hashlib
import json
import re

try:  # Python 3.11+
    import re._parser as sre_parse  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover
    import sre_parse  # type: ignore[no-redef]

SENTENCES = [
    "Tensor parallel inference splits every weight matrix across the devices of a group.",
    "Each device computes a slice of the layer and the slices are gathered over the network.",
    "The scheduler admits requests in arrival order while the batch has room.",
    "A key value cache keeps the attention state of every running sequence.",
    "Speculative decoding drafts a few tokens and the target model verifies them at once.",
    "Prefix caching reuses the blocks of a prompt that an earlier request already computed.",
    "A hash map stores values in buckets chosen by the hash of their keys.",
    "Collisions are resolved by probing the next bucket or by chaining entries.",
    "The gateway admits a request only when the engine has a free sequence slot.",
    "Streaming responses send each token as soon as the engine produces it.",
]
THOUGHTS = [
    "The user asks a question and I should answer it directly.",
    "Let me consider what the question needs before I write the answer.",
    "I will check the arithmetic and the facts once more.",
]
# The tokenizer is trained on this, so the fake model's words are short token sequences.
CORPUS = (
    SENTENCES
    + THOUGHTS
    + [
        "What is 17*19? Reply with the integer only. 323",
        "Reasoning Effort: Low High Max 50 75 100 (range 1-100, the higher the value)",
        '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
        '{"type": "object", "properties": {}, "required": [], "answer": "yes", "value": 0}',
        "0123456789 true false null [] {} <> ,.:;!?'\"-_/\\|@#$%^&*()+=~`",
        "The tool returned a result and here is the answer based on it.",
    ]
)


def _seed(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def prose(seed_text: str, sentences: int | None = None) -> str:
    """64-255 tokens of deterministic prose chosen by `seed_text`."""
    seed = _seed(seed_text)
    count = sentences if sentences is not None else 4 + seed % 9
    return " ".join(SENTENCES[(seed + i * 7) % len(SENTENCES)] for i in range(count))


class Prompt:
    """What the fake model reads off the rendered prompt."""

    def __init__(self, text: str, profile: str):
        self.text = text
        self.profile = profile
        user_tag, asst_tag = ("<｜User｜>", "<｜Assistant｜>") if profile == "deepseek" else ("<|user|>", "<|assistant|>")
        tail = text.rsplit(user_tag, 1)[-1]
        self.user = tail.split(asst_tag, 1)[0]
        self.thinking = text.rstrip().endswith("<think>")
        m = re.search(r"Reasoning Effort: ([A-Za-z0-9]+)", text)
        self.effort = m.group(1) if m else None
        results = re.findall(r"<tool_(?:result|response)>(.*?)</tool_(?:result|response)>", tail, re.S)
        self.after_tool = bool(results)
        self.tool_result = results[-1].strip() if results else ""
        self.tools = _tools_in(text)


def _tools_in(text: str) -> list[dict]:
    """Function definitions rendered into the prompt (JSON objects naming a function)."""
    found, decoder, i = [], json.JSONDecoder(), 0
    while (i := text.find("{", i)) != -1:
        try:
            obj, end = decoder.raw_decode(text, i)
        except ValueError:
            i += 1
            continue
        fn = obj.get("function", obj) if isinstance(obj, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str) and "parameters" in fn:
            found.append(fn)
        i = end
    return found


def reasoning(prompt: Prompt) -> str:
    """Reasoning that shows the rendered effort; more of it for higher efforts."""
    label = prompt.effort or "default"
    levels = {"Low": 1, "50": 1, "High": 2, "75": 2, "Max": 4, "100": 4}
    lines = levels.get(label, 2)
    if label.isdigit():
        lines = max(1, int(label) // 25)
    return f"Reasoning Effort: {label}. " + " ".join(THOUGHTS[i % len(THOUGHTS)] for i in range(lines))


def tool_call(profile: str, name: str, args: dict) -> str:
    """One call in the profile's syntax (DeepSeek DSML, GLM 4.7 tool_call)."""
    if profile == "deepseek":
        params = "\n".join(
            f'<｜DSML｜ parameter name="{k}" string="{"true" if isinstance(v, str) else "false"}">'
            f'{v if isinstance(v, str) else json.dumps(v)}</｜DSML｜ parameter>'
            for k, v in args.items()
        )
        return f'<｜DSML｜ calls>\n<｜DSML｜ invoke name="{name}">\n{params}\n</｜DSML｜ invoke>\n</｜DSML｜ calls>'
    kv = "".join(
        f"<arg_key>{k}</arg_key><arg_value>{v if isinstance(v, str) else json.dumps(v)}</arg_value>" for k, v in args.items()
    )
    return f"<tool_call>{name}{kv}</tool_call>"


def answer(prompt: Prompt, structured) -> str:
    """The visible answer (after any reasoning)."""
    if structured is not None:
        return satisfy(structured, prompt)
    if prompt.tools and not prompt.after_tool:
        for fn in prompt.tools:
            if fn["name"] in prompt.user:
                return tool_call(prompt.profile, fn["name"], instance(fn.get("parameters") or {}))
    if prompt.after_tool:
        return f"The tool returned: {prompt.tool_result}"
    if "17*19" in prompt.user:
        return "323"
    if "Which numbers did I say?" in prompt.user:
        return recall(prompt)
    return prose(prompt.user)


def recall(prompt: Prompt) -> str:
    """Every "remember the number N" of the prompt's user turns, in order: the test of a
    conversation sent whole (vllm-sim's model answers it the same way)."""
    user_tag, asst_tag = ("<｜User｜>", "<｜Assistant｜>") if prompt.profile == "deepseek" else ("<|user|>", "<|assistant|>")
    turns = [part.split(asst_tag, 1)[0] for part in prompt.text.split(user_tag)[1:]]
    numbers = [m for t in turns for m in re.findall(r"remember the number (\d+)", t)]
    return "You said: " + ", ".join(numbers) + "."


def plan(prompt_text: str, profile: str, structured) -> str:
    """Everything the model generates after the prompt, without the end-of-sequence token."""
    prompt = Prompt(prompt_text, profile)
    body = answer(prompt, structured)
    if prompt.thinking:
        return reasoning(prompt) + "</think>" + body
    return body


# --- structured outputs -------------------------------------------------------------------


def satisfy(so, prompt: Prompt) -> str:
    """Output that satisfies vLLM's StructuredOutputsParams `so`."""
    if so.json is not None:
        schema = json.loads(so.json) if isinstance(so.json, str) else so.json
        return json.dumps(instance(schema, schema), ensure_ascii=False)
    if so.json_object:
        return json.dumps({"answer": prose(prompt.user, 1)})
    if so.choice:
        return so.choice[0]
    if so.regex is not None:
        return regex_instance(so.regex)
    if so.structural_tag is not None:
        return structural(json.loads(so.structural_tag), prompt)
    return prose(prompt.user, 1)


def _resolve(schema: dict, root: dict) -> dict:
    ref = schema.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return schema
    node = root
    for part in ref[2:].split("/"):
        node = node.get(part, {})
    return _resolve(node, root)


def instance(schema, root=None, depth: int = 0):
    """A small value valid under JSON schema `schema`."""
    root = root if root is not None else schema
    if not isinstance(schema, dict) or depth > 12:
        return None
    schema = _resolve(schema, root)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            options = [o for o in schema[key] if _resolve(o, root).get("type") != "null"] or schema[key]
            return instance(options[0], root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    if kind == "object":
        props = schema.get("properties") or {}
        return {k: instance(v, root, depth + 1) for k, v in props.items()}
    if kind == "array":
        item = instance(schema.get("items") or {"type": "string"}, root, depth + 1)
        return [item] * max(1, int(schema.get("minItems", 1)))
    if kind == "integer":
        return int(schema.get("minimum", schema.get("exclusiveMinimum", -1) + 1 if "exclusiveMinimum" in schema else 0))
    if kind == "number":
        return float(schema.get("minimum", 0.0))
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    if "pattern" in schema:
        return regex_instance(schema["pattern"])
    text = "Paris"
    lo, hi = int(schema.get("minLength", 0)), int(schema.get("maxLength", 1 << 30))
    return (text * (lo // len(text) + 1))[: max(lo, min(len(text), hi))]


def regex_instance(pattern: str) -> str:
    """The shortest-ish string the regex matches (literals, classes, repeats, groups)."""
    return _walk(sre_parse.parse(pattern))


def _walk(nodes) -> str:
    out = []
    for op, av in nodes:
        name = str(op)
        if name == "LITERAL":
            out.append(chr(av))
        elif name == "ANY":
            out.append("a")
        elif name == "IN":
            out.append(_class(av))
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            lo, _hi, sub = av
            out.append(_walk(sub) * max(lo, 0))
        elif name == "SUBPATTERN":
            out.append(_walk(av[-1]))
        elif name == "BRANCH":
            out.append(_walk(av[1][0]))
        elif name in ("ATOMIC_GROUP",):
            out.append(_walk(av))
    return "".join(out)


def _class(items) -> str:
    negate = False
    for op, av in items:
        name = str(op)
        if name == "NEGATE":
            negate = True
        elif negate:
            continue
        elif name == "LITERAL":
            return chr(av)
        elif name == "RANGE":
            return chr(av[0])
        elif name == "CATEGORY":
            return {"CATEGORY_DIGIT": "0", "CATEGORY_SPACE": " "}.get(str(av), "a")
    return "a" if negate else "a"


def structural(tag: dict, prompt: Prompt) -> str:
    """A tool call under a structural tag. A triggered tag (`at_least_one: false`, what vLLM
    sends for `tool_choice: auto`) only constrains a call the model chooses to make; a forced
    one (required / named) makes the model call the first function the tag allows."""
    if not tag.get("format", {}).get("at_least_one", True):
        return answer(prompt, None)
    text = json.dumps(tag)
    names = re.findall(r'"name"\s*:\s*"([^"]+)"', text) + re.findall(r"<tool_call>([\w.\-]+)", text)
    names += re.findall(r'name=\\"([^"\\]+)\\"', text)
    fn = next((f for f in prompt.tools if f["name"] in names), prompt.tools[0] if prompt.tools else None)
    if fn is None:
        return prose(prompt.user, 1)
    return tool_call(prompt.profile, fn["name"], instance(fn.get("parameters") or {}))
