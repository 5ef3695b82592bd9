"""Commands of the models area: `foxformer bench-model`, `foxformer presets`."""
from __future__ import annotations


def _presets(args) -> int:
    from .presets import main
    main()
    return 0


def add_commands(sub) -> None:
    from foxformer.bench import model as bench_model

    bench_model.configure(sub.add_parser("bench-model", help="training tokens/s and peak memory of whole models "
                                                             "(and transformers' LlamaForCausalLM as anchor)"))
    sub.add_parser("presets", help="list model presets with non-embedding parameter counts").set_defaults(
        func=_presets)
