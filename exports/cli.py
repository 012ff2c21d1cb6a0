"""``hallulog export {wds,saev,saelens,sft,lm-polygraph,uqlm} SRC DST [options]``: the exports.

SRC is an activation store (wds, saev, saelens), a ``consolidated/`` directory (sft; saelens
takes token ids from one) or a run's artifact root (lm-polygraph, uqlm); see
docs/formats/{wds,saev,saelens,sft-packed,lm-polygraph,uqlm}.md. Prints the result as JSON; bad
input is one ``error:`` line naming the argument, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys


def _int_list(v: str) -> list[int]:
    try:
        return [int(x) for x in v.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {v!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hallulog export", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="kind", required=True)
    w = sub.add_parser("wds", help="WebDataset Option A tar shards (seed 002)")
    w.add_argument(
        "--shard-mb", type=int, default=512, help="shard size budget in MiB (256-1024 suggested)"
    )
    w.add_argument(
        "--texts", help="JSONL with sample_key/activation_key, prompt, response -> samples.jsonl"
    )
    w.add_argument("--split", help="split name stored in every meta.json")
    w.add_argument("--fixed-shapes", action="store_true", help="pad every record to P_max / R_max")
    s = sub.add_parser(
        "saev", help="saev shards that saev's own readers load; DST must be new or empty"
    )
    s.add_argument(
        "--layers", type=_int_list, help="comma-separated model layer ids (default: all stored)"
    )
    s.add_argument(
        "--max-tokens-per-shard", type=int, default=2_400_000, help="shard budget in token rows"
    )
    s.add_argument("--ckpt", default="", help="model identifier for metadata.ckpt")
    a = sub.add_parser(
        "saelens", help="one layer as SAELens cached activations; DST must be new or empty"
    )
    a.add_argument("--layer", type=int, required=True, help="model layer id to export")
    a.add_argument(
        "--context-size",
        type=int,
        default=128,
        help="tokens per dataset row (SAELens context_size)",
    )
    a.add_argument(
        "--hook-name", help="column name (default: the TransformerLens residual hook of the layer)"
    )
    a.add_argument("--dtype", choices=["float32", "float16"], default="float32")
    a.add_argument(
        "--tokens", help="consolidated/ directory with the token ids (default: SRC when it is one)"
    )
    f = sub.add_parser(
        "sft", help="packed SFT memmap shards (seed 004) from consolidated/ generations"
    )
    f.add_argument("--pack-size", type=int, default=4096)
    f.add_argument(
        "--select",
        choices=["correct_primary", "primary", "correct", "all"],
        default="correct_primary",
    )
    f.add_argument("--bins-per-shard", type=int)
    lp = sub.add_parser(
        "lm-polygraph",
        help="a run's statistics under LM-Polygraph's names (SRC: the artifact root)",
    )
    lp.add_argument(
        "--layer",
        type=int,
        help="model layer id of embeddings_decoder (default: the last stored layer)",
    )
    lp.add_argument(
        "--no-hidden",
        action="store_true",
        help="write no hidden-state arrays (embeddings_decoder, sample_embeddings)",
    )
    lp.add_argument(
        "--no-attention",
        action="store_true",
        help="write no attention_all.npy (the run's --attention-features summaries)",
    )
    u = sub.add_parser(
        "uqlm", help="what UQLM's scorers take: responses, samples, logprobs (SRC: artifact root)"
    )
    for sp in (w, s, a, f, lp, u):
        sp.add_argument("src")
        sp.add_argument("dst")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from hallulog.storage.errors import StorageError, UnknownFormatError

    try:
        if args.kind == "wds":
            from hallulog.exports.wds import export_wds

            out = export_wds(
                args.src,
                args.dst,
                shard_bytes=args.shard_mb << 20,
                texts=args.texts,
                split=args.split,
                fixed_shapes=args.fixed_shapes,
            )
            out = {k: out[k] for k in ("num_records", "shards")}
        elif args.kind == "saev":
            from hallulog.exports.saev import export_saev

            out = {
                "path": export_saev(
                    args.src,
                    args.dst,
                    layers=args.layers,
                    max_tokens_per_shard=args.max_tokens_per_shard,
                    ckpt=args.ckpt,
                )
            }
        elif args.kind == "saelens":
            from hallulog.exports.saelens import export_saelens

            out = export_saelens(
                args.src,
                args.dst,
                layer=args.layer,
                context_size=args.context_size,
                hook_name=args.hook_name,
                dtype=args.dtype,
                tokens=args.tokens,
            )
        elif args.kind == "lm-polygraph":
            from hallulog.exports.lm_polygraph import export_lm_polygraph

            out = export_lm_polygraph(
                args.src,
                args.dst,
                layer=args.layer,
                hidden=not args.no_hidden,
                attention=not args.no_attention,
            )
        elif args.kind == "uqlm":
            from hallulog.exports.uqlm import export_uqlm

            out = export_uqlm(args.src, args.dst)
        else:
            from hallulog.exports.sft_packed import export_sft

            out = export_sft(
                args.src,
                args.dst,
                pack_size=args.pack_size,
                select=args.select,
                bins_per_shard=args.bins_per_shard,
            )
    except UnknownFormatError as e:
        print(f"error: src: {e}", file=sys.stderr)
        return 2
    except (StorageError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
