"""The table and the plot of docs/dlrm.md from the JSON that python/examples/dlrm_training.py
writes (--json): one run over the 1 Gb/s link and, optionally, one over shared memory.

    python3 bench/dlrm_training_report.py LINK.json [SHM.json] [--plot docs/img/dlrm_training.png]
"""
import argparse
import json
import pathlib
import statistics


def label(r):
    b = r["bounds"]
    v = r["variant"]
    if v.startswith("kompress"):
        name = {"kompress": "kompress", "kompress-adaptive": "kompress adaptive",
                "kompress-allreduce": "kompress + allreduce"}[v]
        return f"{name} REL {b['forward_rel']:g} / {b['backward_rel']:g}"
    return {"plain": "plain fp32", "fp16": "fp16 cast", "bf16": "bf16 cast", "int8": "row-wise int8"}[v]


def key(r):
    return (r["variant"], r["bounds"]["forward_rel"], r["bounds"]["backward_rel"], r["seed"])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("link", type=pathlib.Path)
    parser.add_argument("shm", type=pathlib.Path, nargs="?")
    parser.add_argument("--plot", type=pathlib.Path)
    args = parser.parse_args()
    runs = json.loads(args.link.read_text())["results"]
    shm = {key(r): r for r in json.loads(args.shm.read_text())["results"]} if args.shm else {}

    plain = [r for r in runs if r["variant"] == "plain"]
    base = plain[0]
    aucs = [r["final"]["auc"] for r in plain]
    spread = max(aucs) - min(aucs)
    print(f"plain over seeds {[r['seed'] for r in plain]}: AUC {', '.join(f'{a:.4f}' for a in aucs)}; "
          f"spread (max - min) {spread:.4f}, stdev {statistics.pstdev(aucs):.4f}; "
          f"log loss {', '.join(f'{r['final']['log_loss']:.4f}' for r in plain)}")
    print()
    print("| variant | seed | held-out AUC | Δ AUC | log loss | fwd MB/it | fwd x | bwd MB/it | bwd x "
          "| 1 Gb/s ms/it | exchange ms (fwd + bwd) | allreduce ms | compute ms | speedup "
          "| shm ms/it | speedup | fwd err/bound | bwd err/bound |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    plain_shm = shm.get(key(base))
    for r in runs:
        b, ms = r["bytes_per_iteration"], r["ms"]
        s = shm.get(key(r))
        shm_cols = (f"{s['ms']['iteration']:.0f} | {plain_shm['ms']['iteration'] / s['ms']['iteration']:.2f}"
                    if s and plain_shm else "- | -")
        bounded = r["variant"].startswith("kompress")
        err = lambda d: max(r["errors"][d]["error_over_bound"])
        print(f"| {label(r)} | {r['seed']} | {r['final']['auc']:.4f} | {r['final']['auc'] - base['final']['auc']:+.4f} "
              f"| {r['final']['log_loss']:.4f} "
              f"| {b['forward'] / 1e6:.3f} | {base['bytes_per_iteration']['forward'] / b['forward']:.2f} "
              f"| {b['backward'] / 1e6:.3f} | {base['bytes_per_iteration']['backward'] / b['backward']:.2f} "
              f"| {ms['iteration']:.0f} | {ms['forward_exchange']:.0f} + {ms['backward_exchange']:.0f} "
              f"| {ms['allreduce']:.0f} | {ms['compute']:.0f} | {base['ms']['iteration'] / ms['iteration']:.2f} "
              f"| {shm_cols} | {err('forward'):.3g}{'' if bounded else '*'} | {err('backward'):.3g}{'' if bounded else '*'} |")

    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (ax_auc, ax_loss) = plt.subplots(1, 2, figsize=(13, 5))
        for r in runs:
            its = [c["iteration"] for c in r["curve"]]
            style = "--" if r["variant"] == "plain" and r is not base else "-"
            name = label(r) + (f" (seed {r['seed']})" if r["variant"] == "plain" else "")
            ax_auc.plot(its, [c["auc"] for c in r["curve"]], style, marker=".", label=name)
            ax_loss.plot(its, [c["log_loss"] for c in r["curve"]], style, marker=".", label=name)
        ax_auc.set(xlabel="iteration (global batch 1024)", ylabel="held-out AUC",
                   title="DLRM on nycflights13, 4 ranks: held-out AUC")
        ax_loss.set(xlabel="iteration (global batch 1024)", ylabel="held-out log loss", title="held-out log loss")
        for ax in (ax_auc, ax_loss):
            ax.grid(alpha=0.3)
        ax_auc.legend(fontsize=7)
        # the end of the pass, where the variants differ by less than the seeds
        inset = ax_auc.inset_axes([0.45, 0.1, 0.5, 0.4])
        for r in runs:
            tail = [c for c in r["curve"] if c["iteration"] >= r["iterations"] // 2]
            inset.plot([c["iteration"] for c in tail], [c["auc"] for c in tail],
                       "--" if r["variant"] == "plain" and r is not base else "-", marker=".")
        inset.grid(alpha=0.3)
        inset.tick_params(labelsize=6)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
