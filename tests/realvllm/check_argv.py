"""Checks launch-plan argvs with vLLM's own (0.33.0 or 0.34.0) `vllm serve` parser and validation.

stdin: JSON [{"name": ..., "profile": "deepseek"|"glm", "argv": ["serve", MODEL, ...]}, ...]
stdout: per case a line `argv-check: {"name", "ok", "error", "dropped"}` among vLLM's log lines.

Each argv goes through what `vllm serve` does before it loads a model: the real
FlexibleArgumentParser with the serve subcommand's arguments (unknown flags, bad values and
bad JSON fail here), `validate_parsed_serve_args` (parser/tool-choice combinations, chat
template), then `AsyncEngineArgs.from_cli_args(...).create_engine_config()` (VllmConfig:
speculative config, cache, scheduler, parallel settings). Paths that exist only inside the
deployment image are replaced first, as in the fixture (`fixture.rewrite`); `--quantization
exl3` is dropped and reported, because EXL3 is the image's plugin, not the stock package's.
"""

import contextlib
import io
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import fixture  # noqa: E402  (sets the CPU / offline environment first)


def parser():
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    p = FlexibleArgumentParser(prog="vllm")
    subparsers = p.add_subparsers(required=False, dest="subparser")
    cmd = ServeSubcommand()
    cmd.subparser_init(subparsers)
    return p, cmd


def check(p, cmd, case, dirs) -> dict:
    import vllm

    model, facts, draft = dirs[case["profile"]]
    argv = case["argv"]
    dropped = [v for f, v in zip(argv, argv[1:]) if f in fixture.PLUGIN_ONLY and v in fixture.PLUGIN_ONLY[f]]
    argv = fixture.rewrite(argv, model, facts["template"], draft, "0")
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = p.parse_args(argv)
        if args.model_tag is not None:
            args.model = args.model_tag
        cmd.validate(args)
        engine_args = vllm.AsyncEngineArgs.from_cli_args(args)
        engine_args.create_engine_config(headless=bool(args.headless))
    except SystemExit as e:
        return {"name": case["name"], "ok": False, "error": f"argparse exit {e.code}: {err.getvalue().strip()}"}
    except Exception as e:  # noqa: BLE001 — every refusal is reported, not raised
        return {"name": case["name"], "ok": False, "error": f"{type(e).__name__}: {e}"}
    return {"name": case["name"], "ok": True, "error": None, "dropped": dropped}


def main() -> None:
    cases = json.load(sys.stdin)
    work = tempfile.mkdtemp(prefix="sparkgate-argv-")
    dirs = {name: fixture.prepare(name, os.path.join(work, name)) for name in {c["profile"] for c in cases}}
    fixture.allow_config_without_triton()
    p, cmd = parser()
    for case in cases:
        print("argv-check: " + json.dumps(check(p, cmd, case, dirs)), flush=True)


if __name__ == "__main__":
    main()
