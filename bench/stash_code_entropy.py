"""How many bits the stash's codes of a ReLU output's positive values need, against what the
fast codec's blocks give them: for each file and relative bound, the empirical entropy of the
codes (stochastic rounding on a step of the bound, as the stash's `rounding=stochastic` does;
and rounding to nearest on twice the bound) against the mean width of blocks of 32 such codes,
each block's codes taken from its smallest (the fast codec's plain blocks, docs/format.md,
before their descriptor and base). docs/stash.md, "Where a 10x would have to come from".
Then the same for a bound relative to each group of 256 values' own range (that range itself;
the stash's group_relative saves take the power of two below it): ActNN's 2-bit codes are such a
bound, a third of the group's range with stochastic rounding; what its positive values' codes
would need entropy-coded, with a sign bit per value and 8 bytes a group, against ActNN's 2 bits
a value, its mask bit and the same 8 bytes (docs/stash.md, "Limits and future work").

    python3 bench/stash_code_entropy.py [--data ../shared/data] [--seed 1]
"""
import argparse
import os
import pathlib

import numpy as np

FILES = ("act_mlp_relu2_out_1024x1024.f32", "act_cnn_s3_relu_out_128x64x8x8.f32",
         "act_cnn_stem_relu_out_128x16x32x32.f32")


def entropy(codes):
    _, counts = np.unique(codes, return_counts=True)
    p = counts / counts.sum()
    return float(-(p * np.log2(p)).sum())


def block_width(codes, block=32):
    n = codes.size // block * block
    b = codes[:n].reshape(-1, block)
    return float(np.ceil(np.log2(b.max(1) - b.min(1) + 1)).mean())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=os.environ.get("KOMPRESS_DATA_DIR") or
                        str(pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data"))
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"{'file':40} {'REL':>6} {'positive':>8} {'stochastic: entropy':>20} {'block width':>12}"
          f" {'nearest: entropy':>17} {'block width':>12}")
    loaded = {}
    for name in FILES:
        path = pathlib.Path(args.data) / name
        if not path.exists():
            print(f"{name:40} skipped: only the full data set has it")
            continue
        x = loaded[name] = np.fromfile(path, np.float32).astype(np.float64)
        positive = x[x > 0]
        for rel in (1e-2, 5e-2, 1e-1):
            e = rel * (x.max() - x.min())
            stochastic = np.floor(positive / e + rng.random(positive.size)).astype(np.int64)
            nearest = np.rint(positive / (2 * e)).astype(np.int64)
            print(f"{name:40} {rel:>6g} {positive.size / x.size:>8.2f} {entropy(stochastic):>18.2f} b"
                  f" {block_width(stochastic):>10.2f} b {entropy(nearest):>15.2f} b {block_width(nearest):>10.2f} b")
    print(f"\n{'file':40} {'per group':>9} {'positive':>8} {'entropy':>8} {'bits a value':>13} {'ActNN 2-bit':>12}")
    for name, x in loaded.items():
        groups = x.reshape(-1, 256)
        low = groups.min(1, keepdims=True)
        width = groups.max(1, keepdims=True) - low
        positive = groups > 0
        for share in (3, 6, 10):  # the bound: a third of each group's range (ActNN's), a sixth, a tenth
            e = np.where(width > 0, width / share, 1.0)
            codes = np.floor((groups - low) / e + rng.random(groups.shape)).astype(np.int64)[positive]
            bits = 1 + positive.mean() * entropy(codes) + 64 / 256
            print(f"{name:40} {'1/' + str(share):>9} {positive.mean():>8.2f} {entropy(codes):>6.2f} b"
                  f" {bits:>11.2f} b {2 + 1 + 64 / 256:>10.2f} b")


if __name__ == "__main__":
    main()
