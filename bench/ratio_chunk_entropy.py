"""What an entropy coder would take on the ratio codec's chunks, against the Rice codes and bit
planes the codec writes (format 1.2): for each file and relative bound, the values are cut into
the pieces the stash stores (a ReLU output's positive values, 2,048 to a piece, as a packed
segment of 16 KiB holds; any other tensor in chunks of 4,096 values), each piece compressed by
the library (`kompress.compress`, the ratio codec, stochastic rounding on the absolute bound
the relative one gives) and, beside it, its codes coded by a static rANS coder of its own
residuals (the previous value's or none, whichever is shorter, as the codec chooses): a
frequency table of 12-bit precision per piece, an escape for residuals of 255 or more (32 raw
bits), the coder's 4-byte final state and a 2-byte piece header. Every rANS piece is decoded
again and compared with its codes. The codes' empirical entropy per piece is the floor any
order-0 coder of those residuals has; the "order 1" column, their entropy given the previous
residual (0, 1, 2 or more), what an adaptive coder with that context could approach.

Bits per coded value (the positive ones of a ReLU output), the chunk's bytes only (the stream
header and chunk table, which both would keep, left out). It times nothing.
docs/stash.md, "Limits and future work".

    PYTHONPATH=build/python/python/package python3 bench/ratio_chunk_entropy.py [--data ../shared/data] [--seed 1]
"""
import argparse
import math
import os
import pathlib

import numpy as np

import kompress

SCALE_BITS = 12
ESCAPE = 255
RANS_LOW = 1 << 23
# file, whether it is a ReLU output (its positive values packed), shape it is read as
FILES = (("act_mlp_relu2_out_1024x1024.f32", True), ("act_mlp_fc1_out_1024x1024.f32", False),
         ("act_cnn_stem_relu_out_128x16x32x32.f32", True), ("act_tfm_b1_ln1_in_32x128x128.f32", False),
         ("mnist_t10k_images_10000x28x28.u8", False))
STREAM_OVERHEAD = 88 + 16  # header and one chunk's table entries: both coders keep them


def normalized(counts):
    """Frequencies summing to 2^SCALE_BITS, every symbol present at least 1."""
    total = counts.sum()
    freqs = np.where(counts > 0, np.maximum(1, np.round(counts * (1 << SCALE_BITS) / total)), 0).astype(np.int64)
    freqs[np.argmax(freqs)] += (1 << SCALE_BITS) - freqs.sum()
    assert freqs.min() >= 0 and freqs.sum() == 1 << SCALE_BITS and np.all((freqs > 0) == (counts > 0))
    return freqs


def table_bits(freqs):
    """The table as it would be stored: the alphabet's size (8 bits), then each frequency in an
    Elias-gamma code of f + 1."""
    return 8 + sum(2 * int(math.floor(math.log2(f + 1))) + 1 for f in freqs)


def rans_encode(symbols, freqs):
    cum = np.concatenate([[0], np.cumsum(freqs)[:-1]])
    out = bytearray()
    x = RANS_LOW
    for s in reversed(symbols.tolist()):
        f, c = int(freqs[s]), int(cum[s])
        x_max = ((RANS_LOW >> SCALE_BITS) << 8) * f
        while x >= x_max:
            out.append(x & 0xFF)
            x >>= 8
        x = ((x // f) << SCALE_BITS) + (x % f) + c
    out += x.to_bytes(4, "little")
    return bytes(reversed(out))


def rans_decode(data, freqs, n):
    cum = np.concatenate([[0], np.cumsum(freqs)[:-1]])
    lookup = np.repeat(np.arange(freqs.size), freqs)
    x = int.from_bytes(data[:4][::-1], "little")
    at = 4
    out = np.empty(n, np.int64)
    for i in range(n):
        slot = x & ((1 << SCALE_BITS) - 1)
        s = int(lookup[slot])
        out[i] = s
        x = int(freqs[s]) * (x >> SCALE_BITS) + slot - int(cum[s])
        while x < RANS_LOW:
            x = (x << 8) | data[at]
            at += 1
    return out


def zigzag(r):
    return np.where(r >= 0, 2 * r, -2 * r - 1)


def rans_bits(codes):
    """Bits of a piece's codes rANS-coded (the shorter of two predictors), and their entropy."""
    best = None
    for residuals in (zigzag(codes), zigzag(np.diff(codes, prepend=0))):
        symbols = np.minimum(residuals, ESCAPE)
        counts = np.bincount(symbols)
        freqs = normalized(counts)
        data = rans_encode(symbols, freqs)
        assert np.array_equal(rans_decode(data, freqs, symbols.size), symbols)
        escapes = int((residuals >= ESCAPE).sum())
        bits = 8 * (len(data) + 2) + table_bits(freqs) + 32 * escapes
        p = counts[counts > 0] / symbols.size
        entropy = float(-(p * np.log2(p)).sum()) * symbols.size
        if best is None or bits < best[0]:
            best = (bits, entropy, context_entropy(symbols))
    return best


def context_entropy(symbols):
    """Bits of the symbols' entropy given the one before (0, 1, 2, or more: four contexts), what
    an adaptive coder with that context could approach (its tables not counted)."""
    context = np.minimum(np.concatenate([[0], symbols[:-1]]), 3)
    total = 0.0
    for c in range(4):
        counts = np.bincount(symbols[context == c])
        counts = counts[counts > 0]
        if counts.size:
            p = counts / counts.sum()
            total -= float((counts * np.log2(p)).sum())
    return total


def load(folder, name):
    if name.endswith(".u8"):
        return (np.fromfile(folder / name, np.uint8)[:128 * 784].astype(np.float32) / 255)
    return np.fromfile(folder / name, np.float32)[:1 << 18]  # the first 1 MiB: enough pieces


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=os.environ.get("KOMPRESS_DATA_DIR") or
                        str(pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data"))
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    folder = pathlib.Path(args.data)
    print(f"{'file':40} {'REL':>6} {'coded values':>12} {'ratio codec':>12} {'rANS':>8} {'entropy':>8}"
          f" {'rANS saves':>10} {'order 1':>8}")
    for name, relu in FILES:
        if not (folder / name).exists():
            print(f"{name:40} skipped: only the full data set has it")
            continue
        x = load(folder, name)
        for rel in (1e-2, 5e-2, 8e-2, 1.5e-1):
            e = rel * float(x.max() - x.min())
            values = x[x > 0] if relu else x
            per_piece = 2048 if relu else 4096
            codec_bits = rans_total = entropy_total = context_total = 0.0
            for begin in range(0, values.size, per_piece):
                piece = np.ascontiguousarray(values[begin:begin + per_piece])
                stream = kompress.compress(piece, abs=e, codec="ratio", rounding="stochastic",
                                           rounding_seed=args.seed)
                codec_bits += 8 * (len(stream) - STREAM_OVERHEAD)
                codes = np.floor(piece.astype(np.float64) / e + rng.random(piece.size)).astype(np.int64)
                bits, entropy, context = rans_bits(codes)
                rans_total += bits
                entropy_total += entropy
                context_total += context
            n = values.size
            print(f"{name:40} {rel:>6g} {n:>12} {codec_bits / n:>10.2f} b {rans_total / n:>6.2f} b"
                  f" {entropy_total / n:>6.2f} b {1 - rans_total / codec_bits:>9.1%} {context_total / n:>6.2f} b")


if __name__ == "__main__":
    main()
