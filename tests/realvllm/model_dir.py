"""The weightless model directory the real vLLM frontend loads: an offline byte-level BPE
tokenizer with the profile's special and added tokens, a `config.json`, and (GLM) a chat
template reconstructed from the GLM guide's effort rule.

Nothing here is downloaded: the tokenizer is trained at fixture start on the fake model's own
sentences (see `fake_model.CORPUS`), so every word the fake model says is a handful of tokens.
"""

import json
import os

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

# Per profile: special tokens (dropped from text when detokenising) and added, non-special
# tokens (kept in text so the reasoning and tool parsers see them), bos and eos.
PROFILES = {
    "deepseek": {
        "special": [
            "<｜begin▁of▁sentence｜>",
            "<｜end▁of▁sentence｜>",
            "<｜User｜>",
            "<｜Assistant｜>",
            "<｜System｜>",
            "<｜latest_reminder｜>",
            "<｜deepseek_image｜>",
            "<｜action｜>",
            "<｜query｜>",
            "<｜authority｜>",
            "<｜domain｜>",
            "<｜title｜>",
            "<｜read_url｜>",
        ],
        "added": ["<think>", "</think>", "｜DSML｜"],
        "bos": "<｜begin▁of▁sentence｜>",
        "eos": "<｜end▁of▁sentence｜>",
    },
    "glm": {
        "special": [
            "<|endoftext|>",
            "[gMASK]",
            "<sop>",
            "<eop>",
            "<|system|>",
            "<|user|>",
            "<|assistant|>",
            "<|observation|>",
            "<|begin_of_image|>",
            "<|end_of_image|>",
        ],
        "added": [
            "<think>",
            "</think>",
            "<tool_call>",
            "</tool_call>",
            "<arg_key>",
            "</arg_key>",
            "<arg_value>",
            "</arg_value>",
            "<tool_response>",
            "</tool_response>",
        ],
        "bos": "[gMASK]",
        "eos": "<|endoftext|>",
    },
}

# GLM's template: the image's own decides the rendered labels; this one follows the guide's
# rule (effort low or high as given, anything else Max) and has GLM's thinking switch.
GLM_TEMPLATE = r"""[gMASK]<sop>
{%- if tools -%}
<|system|>
# Tools

You may call one or more functions to assist with the user query.
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
{%- endif -%}
{%- for m in messages -%}
{%- set content = m.content if m.content is string else (m.content | map(attribute='text') | join('\n') if m.content else '') -%}
{%- if m.role == 'system' or m.role == 'developer' -%}
<|system|>
{{ content }}
{%- elif m.role == 'user' -%}
<|user|>
{{ content }}
{%- elif m.role == 'assistant' -%}
<|assistant|>
{%- if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% else %}</think>{% endif -%}
{{ content }}
{%- for tc in (m.tool_calls or []) -%}
<tool_call>{{ tc.function.name }}
{%- set args = tc.function.arguments -%}
{%- if args is string -%}{{ args }}{%- else -%}
{%- for k, v in args.items() -%}<arg_key>{{ k }}</arg_key><arg_value>{{ v if v is string else v | tojson }}</arg_value>{%- endfor -%}
{%- endif -%}
</tool_call>
{%- endfor -%}
{%- elif m.role == 'tool' -%}
<|observation|>
<tool_response>{{ content }}</tool_response>
{%- else -%}
<|{{ m.role }}|>
{{ content }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{%- set thinking = enable_thinking is not defined or enable_thinking -%}
{%- if thinking -%}
{%- set effort = reasoning_effort if reasoning_effort in ['low', 'high'] else 'max' -%}
<|system|>
Reasoning Effort: {{ effort | capitalize }}
{%- endif -%}
<|assistant|>
{%- if thinking %}<think>{% else %}</think>{% endif -%}
{%- endif -%}"""

# A stand-in for DeepSeek's `--chat-template` file (the deepseek_v41 tokenizer mode encodes
# prompts in Python and does not read it).
DEEPSEEK_TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"


def _train(profile: dict, corpus: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=3000,
        special_tokens=profile["special"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in profile["added"]])
    return tok


def build(name: str, directory: str, corpus: list[str], draft: bool = False) -> dict:
    """Writes tokenizer and config into `directory` (a DFlash2 drafter's when `draft`);
    returns facts the fixture needs."""
    profile = PROFILES[name]
    os.makedirs(directory, exist_ok=True)
    tok = _train(profile, corpus)
    tok.save(os.path.join(directory, "tokenizer.json"))
    vocab = tok.get_vocab_size(with_added_tokens=True)
    bos, eos = tok.token_to_id(profile["bos"]), tok.token_to_id(profile["eos"])
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": profile["bos"],
        "eos_token": profile["eos"],
        "model_max_length": 1 << 20,
        "clean_up_tokenization_spaces": False,
    }
    if name == "glm":
        tokenizer_config["chat_template"] = GLM_TEMPLATE
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_hidden_layers": 2,
        "vocab_size": vocab,
        "max_position_embeddings": 1 << 20,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "torch_dtype": "bfloat16",
        "rms_norm_eps": 1e-5,
    }
    if name == "glm":
        # GLM's MoE family with one next-token-prediction layer, so `--speculative-config`
        # method `mtp` resolves to its MTP draft as it does for the real checkpoint.
        config.update({
            "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "num_nextn_predict_layers": 1,
            "head_dim": 16, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
            "n_shared_experts": 1, "first_k_dense_replace": 1, "partial_rotary_factor": 0.5, "routed_scaling_factor": 1.0,
            "n_group": 1, "topk_group": 1, "norm_topk_prob": True, "use_qk_norm": False,
        })
    if draft:
        config["architectures"] = ["DFlash2DraftModel"]
        config["model_type"] = "llama"
        config["dflash_config"] = {"target_layer_ids": [0, 1], "mask_token_id": eos}
    for file, body in [("tokenizer_config.json", tokenizer_config), ("config.json", config)]:
        with open(os.path.join(directory, file), "w", encoding="utf-8") as f:
            json.dump(body, f, ensure_ascii=False, indent=1)
    template = os.path.join(directory, "chat_template.jinja")
    with open(template, "w", encoding="utf-8") as f:
        f.write(GLM_TEMPLATE if name == "glm" else DEEPSEEK_TEMPLATE)
    return {"vocab": vocab, "eos": eos, "template": template}
