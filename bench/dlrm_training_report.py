"""The tables and the plot of docs/dlrm.md from the JSON that python/examples/dlrm_training.py
writes (--json): the full pass (accuracy, bytes, errors, curves) and lockstep timing runs.

    python3 bench/dlrm_training_report.py FULL.json [--timing LINK.json SHM.json] [--gbps G] [--plot PNG]
"""
import argparse
import json
import pathlib
import statistics


def label(r):
    b = r["bounds"]
    v = r["variant"].split("@")[0]
    if v.startswith("kompress"):
        name = {"kompress": "kompress", "kompress-adaptive": "kompress adaptive",
                "kompress-allreduce": "kompress + allreduce"}[v]
        return f"{name} REL {b['forward_rel']:g} / {b['backward_rel']:g}"
    return {"plain": "plain fp32", "fp16": "fp16 cast", "bf16": "bf16 cast", "int8": "row-wise int8"}[v]


def key(r):
    return (r["variant"].split("@")[0], r["bounds"]["forward_rel"], r["bounds"]["backward_rel"], r["seed"])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("full", type=pathlib.Path, help="the full pass (accuracy, bytes, errors, curves)")
    parser.add_argument("--timing", type=pathlib.Path, nargs="*", default=[],
                        help="lockstep timing runs (link first, then shared memory)")
    parser.add_argument("--gbps", type=float, default=1.0, help="the rate the ping-pong measured, for wire ms")
    parser.add_argument("--plot", type=pathlib.Path)
    args = parser.parse_args()
    runs = json.loads(args.full.read_text())["results"]

    plain = [r for r in runs if r["variant"] == "plain"]
    base = plain[0]
    aucs = [r["final"]["auc"] for r in plain]
    print(f"plain over seeds {[r['seed'] for r in plain]}: AUC {', '.join(f'{a:.4f}' for a in aucs)}; "
          f"spread (max - min) {max(aucs) - min(aucs):.4f}, stdev {statistics.pstdev(aucs):.4f}; "
          f"log loss {', '.join(f'{r['final']['log_loss']:.4f}' for r in plain)}")
    print()
    print("| variant | seed | held-out AUC | Δ AUC | log loss | fwd MB/it | fwd x | bwd MB/it | bwd x "
          "| fwd err / bound | bwd err / bound |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        b = r["bytes_per_iteration"]
        mark = "" if r["variant"].startswith("kompress") else " *"
        err = lambda d: max(r["errors"][d]["error_over_bound"])
        print(f"| {label(r)} | {r['seed']} | {r['final']['auc']:.4f} | {r['final']['auc'] - base['final']['auc']:+.4f} "
              f"| {r['final']['log_loss']:.4f} "
              f"| {b['forward'] / 1e6:.3f} | {base['bytes_per_iteration']['forward'] / b['forward']:.2f} "
              f"| {b['backward'] / 1e6:.3f} | {base['bytes_per_iteration']['backward'] / b['backward']:.2f} "
              f"| {err('forward'):.3g}{mark} | {err('backward'):.3g}{mark} |")
    for path in args.timing:
        timing = json.loads(path.read_text())
        t = timing["results"]
        tb = t[0]
        print()
        print(f"{path.name}: {t[0]['link']}, {timing['iterations']} iterations in lockstep, {timing['wall_s']:.0f} s")
        print("| variant | ms/it | fwd exchange | bwd exchange | allreduce | compute | wire ms | speedup | AUC at end |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        allreduce_plain = 2 * (tb["ranks"] - 1) / tb["ranks"] * 98433 * 4 * tb["ranks"]   # ring: bytes, all ranks
        for r in t:
            ms, b = r["ms"], r["bytes_per_iteration"]
            wire_bytes = b["forward"] + b["backward"] + (b["allreduce_kompress"] or allreduce_plain)
            print(f"| {label(r)} | {ms['iteration']:.0f} | {ms['forward_exchange']:.0f} | {ms['backward_exchange']:.0f} "
                  f"| {ms['allreduce']:.0f} | {ms['compute']:.0f} | {wire_bytes * 8 / (args.gbps * 1e9) * 1e3:.0f} "
                  f"| {tb['ms']['iteration'] / ms['iteration']:.2f} | {r['final']['auc']:.4f} |")

    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (ax_auc, ax_loss) = plt.subplots(1, 2, figsize=(13, 5.5))
        colors = iter([c for i, c in enumerate(plt.get_cmap("tab10").colors) if i != 7])   # 7 is grey

        def style(r):
            """plain: black (seed 1) and grey dashes (the other seeds: the spread); the rest in colour"""
            if r["variant"] == "plain":
                return ({"color": "black", "linewidth": 2, "zorder": 5} if r is base else
                        {"color": "grey", "linestyle": "--"})
            return {"color": next(colors)}

        inset = ax_auc.inset_axes([0.5, 0.08, 0.47, 0.42])
        for r in runs:
            its = [c["iteration"] for c in r["curve"]]
            name = label(r) + (f" (seed {r['seed']})" if r["variant"] == "plain" else "")
            kw = style(r)
            ax_auc.plot(its, [c["auc"] for c in r["curve"]], marker=".", label=name, **kw)
            ax_loss.plot(its, [c["log_loss"] for c in r["curve"]], marker=".", label=name, **kw)
            # the end of the pass, where the variants differ by less than the seeds
            tail = [c for c in r["curve"] if c["iteration"] >= r["iterations"] * 0.6]
            inset.plot([c["iteration"] for c in tail], [c["auc"] for c in tail], marker=".", **kw)
        ax_auc.set(xlabel="iteration (global batch 1024)", ylabel="held-out AUC",
                   title="DLRM on nycflights13, 4 ranks, one pass: held-out AUC")
        ax_loss.set(xlabel="iteration (global batch 1024)", ylabel="held-out log loss", title="held-out log loss")
        for ax in (ax_auc, ax_loss, inset):
            ax.grid(alpha=0.3)
        inset.tick_params(labelsize=7)
        ax_loss.legend(fontsize=8, loc="upper right")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
