"""Commands of the models area: `foxformer presets`, `foxformer convert official`."""
from __future__ import annotations

import json
import os
import sys


def _presets(args) -> int:
    from .presets import main
    main()
    return 0


def _convert_official(args) -> int:
    from .official import convert_official

    tokenizer = None if args.tokenizer == "none" else args.tokenizer
    try:
        summary = convert_official(args.src, args.out, tokenizer=tokenizer,
                                   max_position_embeddings=args.max_position_embeddings)
    except (ValueError, OSError) as e:
        if os.environ.get("FOXFORMER_DEBUG") == "1":
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=2))
    return 0


def add_commands(sub) -> None:
    sub.add_parser("presets", help="list model presets with non-embedding parameter counts").set_defaults(
        func=_presets)
    convert = sub.add_parser("convert", help="convert checkpoints of other code to foxformer models")
    csub = convert.add_subparsers(dest="convert_command", metavar="SOURCE")
    p = csub.add_parser("official", help="a checkpoint of the FoX paper's code (e.g. its released 760M models)",
                        description="Reads a Hugging Face folder saved by the paper's code (github.com/zhixuan-lin/"
                                    "forgetting-transformer: config.json and model.safetensors or pytorch_model.bin; "
                                    "a Hub id such as "
                                    "zhixuan-lin/fox-pro-760m-longcrawl64-48b where the Hub is reachable) and writes "
                                    "a foxformer model with the same logits: a standalone Hugging Face folder with "
                                    "its tokenizer. Their Mamba-2, DeltaNet, HGRN2 and Samba baselines are refused.")
    p.add_argument("src", metavar="SRC", help="checkpoint folder (or Hub repository id)")
    p.add_argument("--out", required=True, help="output folder (a Hugging Face folder the eval commands read)")
    p.add_argument("--tokenizer", default="auto",
                   help="auto (gpt2-json for their LongCrawl64 models, their tokenizer files otherwise) | a "
                        "tokenizer spec | none")
    p.add_argument("--max-position-embeddings", type=int, default=None,
                   help="written to the config (default: the checkpoint's, else 16384, the released models' "
                        "training context)")
    p.set_defaults(func=_convert_official)
    convert.set_defaults(func=lambda args: (convert.print_help(), 2)[1])
