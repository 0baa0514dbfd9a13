"""`tpulm export`, `tpulm import`, `tpulm fill-mask`: Hugging Face interop and inference."""

from __future__ import annotations

import argparse
import json
import sys

from tpulm.cli._common import presets_text

ORDER = 40


def register(subparsers) -> None:
    """Add the export, import and fill-mask commands."""
    export = subparsers.add_parser(
        "export", help="write a Transformers checkpoint (RobertaForMaskedLM or "
                       "ModernBertForMaskedLM) from a run dir",
        description=(
            "Write model.safetensors, config.json, the tokenizer and a model card: a "
            "RobertaForMaskedLM or ModernBertForMaskedLM folder, after the run's architecture "
            f"(model presets: {presets_text()})."))
    export.add_argument("run_dir", metavar="RUN_DIR", help="run dir (local or gs://)")
    export.add_argument("out_dir", metavar="OUT_DIR", nargs="?",
                        help="output folder (default: RUN_DIR/export)")
    export.add_argument("--step", type=int, help="checkpoint step (default: the latest)")
    export.add_argument("--overwrite", action="store_true", help="replace OUT_DIR if it exists")
    export.add_argument("--push-to-hub", metavar="REPO_ID",
                        help="then upload the folder to this Hub repo (token from `hf auth login` "
                             "or HF_TOKEN)")
    export.add_argument("--public", action="store_true",
                        help="create the Hub repo as public (default: private)")
    export.set_defaults(func=_export)

    imp = subparsers.add_parser(
        "import", help="turn a Transformers RobertaForMaskedLM or ModernBertForMaskedLM folder "
                       "into a run dir",
        description=(
            "Convert a RobertaForMaskedLM or ModernBertForMaskedLM checkpoint (config.json's "
            "model_type roberta or modernbert) so `tpulm train` continues from it; the "
            f"architectures of tpulm's model presets ({presets_text()})."))
    imp.add_argument("hf_dir", metavar="HF_DIR", help="Transformers model folder")
    imp.add_argument("run_dir", metavar="RUN_DIR", help="run dir to create")
    imp.add_argument("--allow-pickle", action="store_true",
                     help="read pytorch_model.bin (a pickle can run code: trusted sources only)")
    imp.add_argument("--overwrite", action="store_true", help="replace RUN_DIR if it exists")
    imp.set_defaults(func=_import)

    fill = subparsers.add_parser(
        "fill-mask", help="predict masked tokens with a run dir, checkpoint or export",
        description="Native Keras fill-mask; output fields as Transformers' pipeline.")
    fill.add_argument("model", metavar="MODEL",
                      help="run dir (latest checkpoint), checkpoint folder or exported folder")
    fill.add_argument("texts", metavar="TEXT", nargs="*",
                      help="texts with the mask token; none: one text per line of stdin")
    fill.add_argument("--top-k", type=int, default=5, help="predictions per mask (default: 5)")
    fill.add_argument("--step", type=int, help="checkpoint step of a run dir (default: latest)")
    fill.add_argument("--json", action="store_true",
                      help="one JSON line per text: the pipeline's list of predictions")
    fill.set_defaults(func=_fill_mask)
    _allow_options_between_texts(fill)


def _allow_options_between_texts(parser: argparse.ArgumentParser) -> None:
    """Let ``MODEL TEXT --top-k 3 TEXT`` parse: plain argparse stops filling a ``nargs="*"``
    positional at the first option. The subparser is called through ``parse_known_args``, so
    that method is routed to the intermixed parser (which itself calls the plain one)."""
    plain = parser.parse_known_args

    def parse_known_args(args=None, namespace=None):
        parser.parse_known_args = plain
        try:
            return parser.parse_known_intermixed_args(args, namespace)
        finally:
            parser.parse_known_args = parse_known_args

    parser.parse_known_args = parse_known_args


def _export(args: argparse.Namespace) -> int:
    from tpulm.hf import export

    out = export.export(export.ExportConfig(
        run_dir=args.run_dir, out_dir=args.out_dir, step=args.step, overwrite=args.overwrite,
        push_to_hub=args.push_to_hub, private=not args.public))
    print(out)
    return 0


def _import(args: argparse.Namespace) -> int:
    from tpulm.hf import importer

    print(importer.import_checkpoint(importer.ImportConfig(
        hf_dir=args.hf_dir, run_dir=args.run_dir, allow_pickle=args.allow_pickle,
        overwrite=args.overwrite)))
    return 0


def _fill_mask(args: argparse.Namespace) -> int:
    from tpulm import config, fill_mask

    texts = args.texts or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    settings = config.resolve(fill_mask.FillMaskConfig, args, where="the command line",
                              texts=tuple(texts))
    results = fill_mask.run(settings)
    for text, result in zip(settings.texts, results):
        print(json.dumps(result, ensure_ascii=False) if args.json
              else fill_mask.format_result(text, result))
    return 0
