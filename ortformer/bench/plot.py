"""PNG plots of the long-sequence scenario (matplotlib, the `bench` extra)."""
from __future__ import annotations

from pathlib import Path

from ..core.fsutil import staged


def plot_long(result: dict, path: Path) -> bool:
    """Latency and peak RSS against N per attention kind, log-log, with O(N) and O(N^2) guides.

    Returns False (and writes nothing) when matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in result["rows"] if r["status"] == "ok"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, label in ((axes[0], "seconds", "latency (s)"), (axes[1], "peak_rss_mb", "peak RSS (MB)")):
        for kind in dict.fromkeys(r["attention"] for r in rows):
            points = sorted((r["sequence"], r[key]) for r in rows if r["attention"] == kind)
            ax.plot(*zip(*points), marker="o", label=kind)
        if rows:
            n0 = min(r["sequence"] for r in rows)
            y0 = min(r[key] for r in rows if r["sequence"] == n0)
            ns = sorted({r["sequence"] for r in rows})
            ax.plot(ns, [y0 * n / n0 for n in ns], "k--", linewidth=0.8, label="O(N)")
            ax.plot(ns, [y0 * (n / n0) ** 2 for n in ns], "k:", linewidth=0.8, label="O(N²)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.set_ylabel(label)
        ax.grid(True, which="both", linewidth=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"ortformer bench long: {result['model']}")
    fig.tight_layout()
    with staged(Path(path), suffix=Path(path).suffix) as tmp:  # matplotlib picks the format by extension
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return True
