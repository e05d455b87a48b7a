"""``--model-arg KEY=VALUE``: one option, one parser, for every command that builds a zoo model."""

from __future__ import annotations

import argparse
import json

__all__ = ["add_model_arg", "parse_model_args"]


def add_model_arg(parser: argparse.ArgumentParser, default: str = "") -> None:
    """Add ``--model-arg`` (repeatable); ``default`` says what applies without it."""
    parser.add_argument("--model-arg", metavar="KEY=VALUE", action="append",
                        help="a zoo model's config override, e.g. image_size=64 or n_layer=4 (repeat it)"
                             + (f"; default: {default}" if default else ""))


def parse_model_args(items: list[str] | None) -> dict:
    """``["n_layer=4", "tie_word_embeddings=false"]`` -> ``{"n_layer": 4, "tie_word_embeddings": False}``."""
    overrides = {}
    for item in items or []:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--model-arg takes KEY=VALUE (e.g. n_layer=4), got {item!r}")
        try:
            value = json.loads(text)
        except ValueError:
            value = text  # a bare word is a string
        overrides[key.strip()] = value
    return overrides
