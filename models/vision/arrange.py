"""Where each projector's image embeddings go in the prompt, as llama.cpp's mtmd places them.

The rendered chat text carries one media marker per image. Text between markers
is tokenized piece by piece (BOS only before the first piece), and each image
becomes its wrapper text plus one span of embedding rows per tile:

- gemma3: <start_of_image> [256 rows, bidirectional] <end_of_image>
- idefics3: per tile "<fake_token_around_image><row_R_col_C>" [64 rows], "\\n" after each
  row of tiles, then "\\n<fake_token_around_image><global-img>" [64 rows, overview]
  "<fake_token_around_image>"
- mlp (LLaVA-1.5): the span alone
- the families of registry.py: their own `layout`
ref: llama.cpp tools/mtmd/mtmd.cpp (mtmd_tokenize) and the prompt layouts in
shared/golden/out/multimodal.json.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MEDIA_MARKER = "<__media__>"


@dataclass
class TileSpan:
    """One tile's embedding rows in the prompt."""

    start: int          # index in the prompt's tokens
    n: int              # embedding rows
    key: str            # content hash of the image + tile index: the multimodal store's key
    tile: object        # float32 [3, H, W] pixels to encode (dropped once encoded)
    bidirectional: bool  # rows attend to each other both ways (and must share a batch)
    counted: bool = False  # counted once as an image-cache hit or miss (ImageStore.reach, .miss)
    # M-RoPE (Qwen-VL): the rows' (columns, rows) grid; the span takes max of the two positions
    grid: tuple[int, int] | None = None

    @property
    def end(self) -> int:
        return self.start + self.n


def arrange(projector: str, tokenizer, pieces: list, tokens_per_tile: int,
            family=None) -> tuple[list[int], list[TileSpan]]:
    """pieces: str (text) or (sha256, Tiles | AudioChunks) in prompt order -> (token ids, spans).

    family: the registry family of the projector (its tiles carry n_tokens), or None.

    Image rows hold negative placeholder ids derived from the image hash, so
    prefix matching compares images by content like tokens.
    """
    tokens: list[int] = []
    spans: list[TileSpan] = []
    first = True
    if family is not None:
        family.check_vocab(tokenizer)
    elif projector == "idefics3":
        # llama.cpp looks these up in the text model's vocabulary and refuses the
        # request when they are missing (mtmd.cpp lookup_token)
        for name in ("<fake_token_around_image>", "<global-img>"):
            if tokenizer.token_to_id(name) is None:
                raise ValueError(f"the text model has no {name} token, which idefics3 images need")

    def text(s: str) -> None:
        nonlocal first
        if s or first:
            tokens.extend(tokenizer.encode(s, add_special=first, parse_special=True))
        first = False

    def image(sha: str, index: int, tile, bidirectional: bool, n: int = tokens_per_tile, grid=None) -> None:
        key = f"{sha}:{index}"
        placeholder = -1 - (int(sha[:12], 16) * 64 + index) % (2**62)
        spans.append(TileSpan(len(tokens), n, key, tile, bidirectional, grid=grid))
        tokens.extend([placeholder] * n)

    for piece in pieces:
        if isinstance(piece, str):
            text(piece)
            continue
        sha, tiles = piece
        if first:
            text("")
        if hasattr(tiles, "layout"):        # an audio clip's chunks place themselves (models/audio/model.py)
            tiles.layout(text, lambda i, sha=sha, tiles=tiles: image(sha, i, tiles[i], False, tiles.n_tokens[i]))
        elif family is not None:
            family.layout(tiles, text, lambda i, bidirectional=False, grid=None, sha=sha, tiles=tiles:
                          image(sha, i, tiles[i], bidirectional, tiles.n_tokens[i], grid))
        elif projector == "gemma3":
            text("<start_of_image>")
            image(sha, 0, tiles[0], True)
            text("<end_of_image>")
        elif projector == "idefics3":
            if tiles.grid_x and tiles.grid_y:
                for r in range(tiles.grid_y):
                    for c in range(tiles.grid_x):
                        text(f"<fake_token_around_image><row_{r + 1}_col_{c + 1}>")
                        image(sha, r * tiles.grid_x + c, tiles[r * tiles.grid_x + c], False)
                    if r < tiles.grid_y - 1:
                        text("\n")
                text("\n\n<fake_token_around_image><global-img>")
            else:
                text("<fake_token_around_image><global-img>")
            image(sha, len(tiles) - 1, tiles[-1], False)
            text("<fake_token_around_image>")
        else:
            for i, t in enumerate(tiles):
                image(sha, i, t, False)
    return tokens, spans


def mrope_positions(n_tokens: int, spans) -> np.ndarray:
    """int32 [4, n_tokens]: the M-RoPE positions (t, h, w, e) of a prompt, as mtmd gives them.

    Text token at position p: (p, p, p, 0), the next is p + 1. The rows of a span with a
    grid (gx, gy) from p0: row i at (p0, p0 + i // gx, p0 + i % gx, 0), and the text
    after it starts at p0 + max(gx, gy). A span without a grid: (p, p, p, p) per row,
    one position each (mtmd's MTMD_POS_TYPE_NORMAL).
    ref: llama.cpp tools/mtmd/mtmd.cpp mtmd_image_tokens_get_decoder_pos / get_n_pos,
    mtmd-helper-common.h set_position_mrope_2d (.y to section 1, .x to section 2).
    """
    pos = np.zeros((4, n_tokens), dtype=np.int32)
    p, i = 0, 0
    for span in sorted(spans, key=lambda s: s.start):
        k = span.start - i
        pos[:3, i:span.start] = p + np.arange(k, dtype=np.int32)
        p += k
        if span.grid is None:
            pos[:, span.start:span.end] = p + np.arange(span.n, dtype=np.int32)
            p += span.n
        else:
            gx, gy = span.grid
            if gx * gy != span.n:
                raise ValueError(f"an image span of {span.n} rows has a {gx}x{gy} grid")
            r = np.arange(span.n, dtype=np.int32)
            pos[0, span.start:span.end] = p
            pos[1, span.start:span.end] = p + r // gx
            pos[2, span.start:span.end] = p + r % gx
            p += max(gx, gy)
        i = span.end
    pos[:3, i:] = p + np.arange(n_tokens - i, dtype=np.int32)
    return pos
