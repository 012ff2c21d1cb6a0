"""``python -m storage.export_cli {wds,saev,sft} SRC DST [options]``: the three exports.

SRC is an activation store (wds, saev) or a ``consolidated/`` directory (sft); see
docs/formats/{wds,saev,sft-packed}.md. Prints the result as JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m storage.export_cli", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="kind", required=True)
    w = sub.add_parser("wds", help="WebDataset Option A tar shards (seed 002)")
    w.add_argument("--shard-mb", type=int, default=512, help="shard size budget in MiB (256-1024 suggested)")
    w.add_argument("--texts", help="JSONL with sample_key/activation_key, prompt, response -> samples.jsonl")
    w.add_argument("--split", help="split name stored in every meta.json")
    w.add_argument("--fixed-shapes", action="store_true", help="pad every record to P_max / R_max")
    s = sub.add_parser("saev", help="saev shard protocol (seed 001); DST is dump_to")
    s.add_argument("--tokens-per-ex", type=int, required=True, help="pad/truncate every sample to this many rows")
    s.add_argument("--patches-per-shard", type=int, default=2_400_000)
    s.add_argument("--dtype", choices=["float32", "float16"], default="float32")
    s.add_argument("--layers", type=lambda v: [int(x) for x in v.split(",")], help="comma-separated layer ids")
    s.add_argument("--align", choices=["left", "right"], default="left")
    s.add_argument("--ckpt", default="", help="model identifier for metadata.ckpt")
    s.add_argument("--overwrite", action="store_true")
    f = sub.add_parser("sft", help="packed SFT memmap shards (seed 004) from consolidated/ generations")
    f.add_argument("--pack-size", type=int, default=4096)
    f.add_argument("--select", choices=["correct_primary", "primary", "correct", "all"], default="correct_primary")
    f.add_argument("--bins-per-shard", type=int)
    for sp in (w, s, f):
        sp.add_argument("src")
        sp.add_argument("dst")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from .errors import StorageError

    try:
        if args.kind == "wds":
            from .wds import export_wds

            out = export_wds(args.src, args.dst, shard_bytes=args.shard_mb << 20, texts=args.texts,
                             split=args.split, fixed_shapes=args.fixed_shapes)
            out = {k: out[k] for k in ("num_records", "shards")}
        elif args.kind == "saev":
            from .saev import export_saev

            out = {"path": export_saev(args.src, args.dst, tokens_per_ex=args.tokens_per_ex,
                                       patches_per_shard=args.patches_per_shard, dtype=args.dtype,
                                       layers=args.layers, align=args.align, ckpt=args.ckpt,
                                       overwrite=args.overwrite)}
        else:
            from .sft_packed import export_sft

            out = export_sft(args.src, args.dst, pack_size=args.pack_size, select=args.select,
                             bins_per_shard=args.bins_per_shard)
    except (StorageError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
