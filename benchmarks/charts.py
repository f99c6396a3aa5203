"""SVG charts for the docs, rendered from the benchmarks' JSON results.

Run from the repository root with the project's venv (matplotlib comes with the ``docs`` extra)::

    python benchmarks/charts.py           # benchmarks/results/*.json -> docs/assets/charts/*.svg
    python benchmarks/charts.py --check   # exit 1 if a committed chart differs from what it renders

Each chart reads one or two result files, written by a benchmark's ``--json-out PATH``:

========================  ==========================================  ============================
chart                     what it shows                               from
========================  ==========================================  ============================
local-throughput.svg      MiB/s of ours, the reference SDK and the    compare.json
                          physical references (tar, cp), local disk
local-speedup.svg         reference time / our time per operation     compare.json
memory.svg                peak RSS per operation, ours and the        compare.json (and
                          reference, and ours on more data            compare-large.json)
objectstore.svg           MiB/s and 1 KiB times on the shaped         objectstore.json
                          network, per client
preemption.svg            what each preemption left behind, per       preemption.json
                          configuration, and the steps lost
dcp.svg                   DCP save/load times per storage layer and   dcp.json
                          the kill trials' outcomes
========================  ==========================================  ============================

Every number drawn comes from those files; the script only knows which figure goes where. The
SVGs are deterministic (no date, ids from a fixed salt, text kept as text), so a test can check
that the committed charts are what this script renders from the committed results. A chart
whose result file is missing is not rendered (and ``--check`` reports it).
"""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.layout_engine import ConstrainedLayoutEngine
from matplotlib.ticker import FuncFormatter, MaxNLocator
from matplotlib.transforms import ScaledTranslation

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
CHARTS = REPO / "docs" / "assets" / "charts"

OURS = "#3f6fb5"
REFERENCE = "#e07b39"
PHYSICAL = "#8c8c8c"
OTHER = "#5aa469"
BAD = "#c0392b"
PALE = "#b9cbe6"


Report = dict[str, Any]


@dataclass
class Bar:
    label: str
    value: float
    color: str
    text: str


@dataclass
class Chart:
    name: str
    inputs: tuple[str, ...]
    """Result files it needs (the first) or uses when present (the rest)."""
    draw: Callable[[dict[str, Report]], Figure]


# --------------------------------------------------------------------------------------------- helpers


def _mib_s(value: float) -> str:
    return f"{value:,.0f} MiB/s" if value >= 10 else f"{value:.1f} MiB/s"


def _seconds(value: float) -> str:
    if value < 1e-3:
        return f"{value * 1e6:.0f} µs"
    if value < 1:
        return f"{value * 1e3:.0f} ms" if value >= 0.01 else f"{value * 1e3:.2f} ms"
    return f"{value:.2f} s"


def _ratio(value: float) -> str:
    return f"{value:.1f}x" if value < 100 else f"{value:.0f}x"


def _size(report: Report) -> str:
    size = report["config"].get("size_mib")
    return f"{size} MiB" if size is not None else "?"


def _machine(report: Report) -> str:
    machine = report["machine"]
    load = report.get("load_average", {})
    text = f"{machine['cpu']}, {machine['nproc']} cores, Python {machine['python']}"
    if "start" in load:
        text += f"; load average {load['start']:.1f}"
        if "end" in load:
            text += f"-{load['end']:.1f}"
    return text


FOOTNOTE_LINE_IN = 0.13
"""Height of one footnote line: the command lines and the machine, under the axes."""


def _command(report: Report) -> str:
    produced = report.get("produced", {})
    return " ".join(["python", produced.get("benchmark", "?"), *produced.get("arguments", [])])


def _figure(report: Report, title: str, width: float, height: float, *also: Report) -> Figure:
    """A figure with ``title`` at the top left and, at the bottom, how its results were produced:
    the command of ``report`` and of each report in ``also``, and the machine."""
    lines = [_command(r) for r in (report, *also)] + [_machine(report)]
    footnote = FOOTNOTE_LINE_IN * len(lines) + 0.12
    height += footnote
    engine = ConstrainedLayoutEngine(rect=(0.0, footnote / height, 1.0, 1.0 - footnote / height))
    figure = Figure(figsize=(width, height), layout=engine)
    figure.suptitle(title, x=0.01, ha="left", fontsize=10, fontweight="bold")
    figure.text(0.01, 0.01, "\n".join(lines), fontsize=7, color="#555555", va="bottom")
    return figure


def _hbars(axes: Axes, groups: list[tuple[str, list[Bar]]], *, log: bool = False) -> None:
    """Horizontal bars in groups, top to bottom, each group under its title (a bold row without a bar)
    unless the title is empty, each bar with its value written beside it."""
    positions: list[float] = []
    labels: list[str] = []
    headers: list[int] = []
    bars: list[Bar] = []
    y = 0.0
    for title, members in groups:
        if title:
            headers.append(len(labels))
            positions.append(y)
            labels.append(title)
            y += 0.9
        for bar in members:
            positions.append(y)
            labels.append(bar.label)
            bars.append(bar)
            y += 1.0
        y += 0.3
    bar_positions = [pos for index, pos in enumerate(positions) if index not in headers]
    axes.barh(bar_positions, [b.value for b in bars], color=[b.color for b in bars], height=0.8)
    axes.set_yticks(positions, labels)
    for index in headers:
        axes.get_yticklabels()[index].set_fontweight("bold")
    axes.set_ylim(y - 0.8, -0.7)
    if log:
        axes.set_xscale("log")
        axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    top = max((b.value for b in bars), default=1.0)
    axes.set_xlim(right=top * (6.0 if log else 1.3))
    for position, bar in zip(bar_positions, bars, strict=True):
        axes.text(bar.value, position, f" {bar.text}", va="center", fontsize=8)
    axes.tick_params(axis="y", length=0)


def _result(report: Report, op: str, impl: str) -> Report | None:
    for result in report["results"]:
        if result["op"] == op and result.get("impl") == impl and result.get("storage") == "local":
            found: Report = result
            return found
    return None


def _physical(report: Report, name: str) -> Report | None:
    for entry in report["physical"]:
        if entry["name"] == name:
            found: Report = entry
            return found
    return None


def _threshold_mib(report: Report, name_start: str) -> float | None:
    """The number in a target's threshold, e.g. ``< 150 MiB`` gives 150 (None when there is none)."""
    for target in report.get("targets", []):
        if str(target["name"]).startswith(name_start):
            match = re.search(r"([0-9.]+)\s*MiB", str(target["threshold"]))
            if match:
                return float(match.group(1))
    return None


# ------------------------------------------------------------------------------------ local disk


# Which physical reference does the same work as which operation (names as compare.py prints them).
THROUGHPUT_ROWS: list[tuple[str, str, list[str]]] = [
    ("file save", "save-file-sync", ["cp (file)", "cp + sync (file)"]),
    ("file load", "load-file-sync", []),
    (
        "directory save",
        "save-dir-sync",
        ["tar -cf (directory)", "tar -cf + sync (directory)", "cp -r (directory)"],
    ),
    ("directory load", "load-dir-sync", ["tar -xf (directory, uncompressed tar)"]),
]


def draw_local_throughput(reports: dict[str, Report]) -> Figure:
    report = reports["compare.json"]
    groups: list[tuple[str, list[Bar]]] = []
    for title, op, physical in THROUGHPUT_ROWS:
        bars: list[Bar] = []
        for impl, label, color in (
            ("ours", "flyte_checkpoint", OURS),
            ("reference", "reference SDK", REFERENCE),
        ):
            result = _result(report, op, impl)
            if result and result["throughput_mib_s"]:
                bars.append(Bar(label, result["throughput_mib_s"], color, _mib_s(result["throughput_mib_s"])))
        for name in physical:
            entry = _physical(report, name)
            if entry and entry["throughput_mib_s"]:
                bars.append(Bar(name, entry["throughput_mib_s"], PHYSICAL, _mib_s(entry["throughput_mib_s"])))
        if bars:
            groups.append((title, bars))
    rows = sum(len(bars) for _, bars in groups)
    title = f"Throughput on local disk, {_size(report)}: sync calls, fresh process per run"
    figure = _figure(report, title, 8.0, 0.9 + 0.22 * (rows + len(groups)))
    axes = figure.add_subplot()
    _hbars(axes, groups, log=True)
    axes.set_xlabel("MiB/s (log scale; data size / median wall time of the call; higher is better)")
    return figure


def draw_local_speedup(reports: dict[str, Report]) -> Figure:
    report = reports["compare.json"]
    targets = {str(t["name"]): t for t in report.get("targets", [])}
    bars: list[Bar] = []
    for result in report["results"]:
        if (
            result["impl"] != "ours"
            or result["storage"] != "local"
            or result["op"].startswith("save-background")
        ):
            continue
        reference = _result(report, result["op"], "reference")
        if not reference or not reference["wall_median_s"] or not result["wall_median_s"]:
            continue
        ratio = reference["wall_median_s"] / result["wall_median_s"]
        target = targets.get(f"{result['op']}: reference / ours")
        label = result["op"] + (f"  (target: {target['threshold']})" if target else "")
        bars.append(Bar(label, ratio, OURS if ratio >= 1 else BAD, _ratio(ratio)))
    title = f"Speed-up over the reference SDK on local disk, {_size(report)}"
    figure = _figure(report, title, 8.0, 0.9 + 0.22 * len(bars))
    axes = figure.add_subplot()
    if bars:
        _hbars(axes, [("", bars)], log=True)
        axes.axvline(1.0, color="#333333", linewidth=0.8)
        axes.set_xlim(left=min(0.5, min(b.value for b in bars) / 2))
    axes.set_xlabel(
        "reference SDK time / flyte_checkpoint time, medians (log scale; above 1x: we are faster)"
    )
    return figure


MEMORY_OPS = [
    "save-file-sync",
    "load-file-sync",
    "load-file-async",
    "save-dir-sync",
    "save-dir-async",
    "load-dir-sync",
    "load-dir-async",
    "save-background-dir-sync",
]


def draw_memory(reports: dict[str, Report]) -> Figure:
    report = reports["compare.json"]
    large = reports.get("compare-large.json")
    groups: list[tuple[str, list[Bar]]] = []
    for op in MEMORY_OPS:
        bars: list[Bar] = []
        candidates = [
            (report, "ours", f"flyte_checkpoint, {_size(report)}", OURS),
            (report, "reference", f"reference SDK, {_size(report)}", REFERENCE),
        ]
        if large is not None:
            candidates.insert(1, (large, "ours", f"flyte_checkpoint, {_size(large)}", PALE))
        for source, impl, label, color in candidates:
            result = _result(source, op, impl)
            if result and result["peak_rss_mib"]:
                bars.append(Bar(label, result["peak_rss_mib"], color, f"{result['peak_rss_mib']:.0f} MiB"))
        if bars:
            groups.append((op, bars))
    rows = sum(len(bars) for _, bars in groups)
    title = "Peak memory per operation on local disk (worst run)"
    figure = _figure(report, title, 8.0, 0.9 + 0.2 * (rows + len(groups)), *([large] if large else []))
    axes = figure.add_subplot()
    _hbars(axes, groups)
    limit = _threshold_mib(report, "peak RSS")
    if limit is not None:
        axes.axvline(limit, color=BAD, linewidth=0.8, linestyle="--")
        axes.text(limit, -0.9, f" target for ours: < {limit:g} MiB", color=BAD, fontsize=8, va="bottom")
    axes.set_xlabel("peak RSS of the worker process, MiB (VmHWM; interpreter and imports included)")
    return figure


# ---------------------------------------------------------------------------------- object stores


CLIENT_COLORS = {"ours": OURS, "reference": REFERENCE, "boto3": OTHER}
CLIENT_LABELS = {"ours": "flyte_checkpoint", "reference": "reference SDK", "boto3": "boto3 (s3transfer)"}


def draw_objectstore(reports: dict[str, Report]) -> Figure:
    report = reports["objectstore.json"]
    config = report["config"]
    large: list[tuple[str, list[Bar]]] = []
    small: list[tuple[str, list[Bar]]] = []
    ops = list(dict.fromkeys(result["op"] for result in report["results"]))
    for op in ops:
        bars: list[Bar] = []
        for result in report["results"]:
            if result["op"] != op or result["error"] or result["wall_median_s"] is None:
                continue
            color = CLIENT_COLORS.get(result["client"], PHYSICAL)
            label = CLIENT_LABELS.get(result["client"], result["client"])
            if op.endswith("-bytes"):
                bars.append(
                    Bar(label, result["wall_median_s"] * 1e3, color, _seconds(result["wall_median_s"]))
                )
            elif result["mib_s"]:
                connections = result.get("peak_connections")
                label += f", {connections} connection{'s' if connections != 1 else ''}" if connections else ""
                bars.append(Bar(label, result["mib_s"], color, _mib_s(result["mib_s"])))
        if bars:
            (small if op.endswith("-bytes") else large).append((op, bars))
    rows_large = sum(len(bars) for _, bars in large) + len(large)
    rows_small = sum(len(bars) for _, bars in small) + len(small)
    title = (
        f"{config['backend'].upper()} on {report['server']} through a shaped network: "
        f"{config['rate_mib']:g} MiB/s per connection, {config['rtt_ms']:g} ms round trip, {_size(report)}"
    )
    figure = _figure(report, title, 8.0, 1.4 + 0.2 * (rows_large + rows_small))
    top, bottom = figure.subplots(2, 1, height_ratios=[max(rows_large, 1), max(rows_small, 1)])
    _hbars(top, large)
    top.set_xlabel("MiB/s (data size / median wall time; higher is better)")
    _hbars(bottom, small)
    bottom.set_xlabel("median time of one 1 KiB call, ms (lower is better)")
    return figure


# ------------------------------------------------------------------------------------- preemption


def _stacked(axes: Axes, labels: list[str], segments: list[tuple[str, list[float], str]]) -> None:
    """One horizontal bar per label, split into segments (name, a value per label, colour), each
    segment's count written inside it; segments that are all zero are left out (and of the legend)."""
    positions = list(range(len(labels)))
    left = [0.0] * len(labels)
    for name, values, color in segments:
        if not any(values):
            continue
        axes.barh(positions, values, left=left, color=color, label=name, height=0.75)
        for position, (start, value) in enumerate(zip(left, values, strict=True)):
            if value:
                axes.text(
                    start + value / 2,
                    position,
                    f"{value:.0f}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="#222222" if color == PALE else "white",
                )
        left = [a + b for a, b in zip(left, values, strict=True)]
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    # Under the x label: a fixed distance in inches, whatever the axes' height.
    below = axes.transAxes + ScaledTranslation(0.0, -0.36, axes.figure.dpi_scale_trans)
    axes.legend(
        loc="upper center", bbox_to_anchor=(0.5, 0.0), bbox_transform=below, ncol=2, fontsize=7, frameon=False
    )
    axes.set_yticks(positions, labels)
    axes.set_ylim(len(labels) - 0.5, -0.5)
    axes.tick_params(axis="y", length=0)


def draw_preemption(reports: dict[str, Report]) -> Figure:
    report = reports["preemption.json"]
    configurations = report["configurations"]
    names = [f"{c['name']}  (G = {c['grace_s']:.2f} s)" for c in configurations]
    committed = [float(c["committed_in_grace"]) for c in configurations]
    kept = [float(c["previous_survived"] - c["committed_in_grace"]) for c in configurations]
    bad = [float(sum(c["bad"].values())) for c in configurations]
    other = [float(c["preemptions"]) - committed[i] - kept[i] - bad[i] for i, c in enumerate(configurations)]
    title = "Preemptions: SIGTERM at a random instant, SIGKILL after the grace period G"
    figure = _figure(report, title, 9.0, 1.3 + 0.24 * len(configurations))
    tallies, lost = figure.subplots(1, 2, width_ratios=[3, 2], sharey=True)
    _stacked(
        tallies,
        names,
        [
            ("a newer save committed in the grace period", committed, OTHER),
            ("the checkpoint stored at the SIGTERM resumed", kept, PALE),
            ("corrupt, mixed or unreadable", bad, BAD),
            ("anything else", other, PHYSICAL),
        ],
    )
    tallies.set_xlabel("preemptions")
    tallies.set_title("What the next attempt resumed from")
    means = [float(c["steps_lost_mean"] or 0.0) for c in configurations]
    colors = [REFERENCE if c["variant"] == "reference" else OURS for c in configurations]
    lost.barh(list(range(len(configurations))), means, color=colors, height=0.75)
    for i, c in enumerate(configurations):
        lost.text(means[i], i, f" mean {means[i]:.1f}, max {c['steps_lost_max']}", va="center", fontsize=7)
    lost.set_xlim(right=max(max(means, default=0.0) * 1.9, 1.0))
    lost.set_xlabel("steps lost per preemption, mean")
    lost.set_title("Work lost")
    return figure


# -------------------------------------------------------------------------------------------- DCP


DCP_LAYERS = {
    "ours": ("flyte_checkpoint (fsync)", OURS),
    "filesystem": ("FileSystemWriter (sync_files)", REFERENCE),
    "ours-nofsync": ("flyte_checkpoint (no fsync)", PALE),
    "ours-s3": ("flyte_checkpoint, S3", OURS),
    "fsspec": ("FsspecWriter, S3", REFERENCE),
}
DCP_FIGURES = {
    "save": "dcp.save",
    "async_blocked": "dcp.async_save: caller blocked",
    "async_total": "dcp.async_save: until uploaded",
    "load": "dcp.load",
}
KILL_OUTCOMES = [
    ("old", "the previous checkpoint, whole", PALE),
    ("new", "the new checkpoint, whole", OTHER),
    ("mixed", "old and new mixed", BAD),
    ("unreadable", "unreadable", "#7f1d1d"),
]


def draw_dcp(reports: dict[str, Report]) -> Figure:
    report = reports["dcp.json"]
    config = report["config"]
    groups: list[tuple[str, list[Bar]]] = []
    for figure_name, title in DCP_FIGURES.items():
        bars: list[Bar] = []
        for table in (report.get("local"), report.get("s3")):
            for layer, values in (table or {}).items():
                if figure_name in values:
                    label, color = DCP_LAYERS.get(layer, (layer, PHYSICAL))
                    bars.append(Bar(label, values[figure_name], color, _seconds(values[figure_name])))
        if bars:
            groups.append((title, bars))
    trials = report.get("kill_trials") or {}
    rows = sum(len(bars) for _, bars in groups) + len(groups)
    layers = list(trials)
    title = f"torch.distributed.checkpoint on {config['world']} gloo ranks: storage layers compared"
    figure = _figure(report, title, 8.0, 1.6 + 0.2 * rows + 0.3 * len(layers))
    times, kills = figure.subplots(2, 1, height_ratios=[rows, 1.5 + len(layers)])
    _hbars(times, groups)
    times.set_xlabel("seconds, median (wall time on rank 0; lower is better)")
    times.set_title(f"Times, {config['mib']} MiB")
    _stacked(
        kills,
        [DCP_LAYERS.get(layer, (layer, ""))[0] for layer in layers],
        [
            (label, [float(trials[layer].get(key, 0)) for layer in layers], color)
            for key, label, color in KILL_OUTCOMES
        ],
    )
    kills.set_xlabel("trials")
    kills.set_title(
        f"Kill trials, {config['kill_mib']} MiB: a random rank SIGKILLed mid-save, then a fresh load"
    )
    return figure


CHART_LIST = [
    Chart("local-throughput.svg", ("compare.json",), draw_local_throughput),
    Chart("local-speedup.svg", ("compare.json",), draw_local_speedup),
    Chart("memory.svg", ("compare.json", "compare-large.json"), draw_memory),
    Chart("objectstore.svg", ("objectstore.json",), draw_objectstore),
    Chart("preemption.svg", ("preemption.json",), draw_preemption),
    Chart("dcp.svg", ("dcp.json",), draw_dcp),
]


# ------------------------------------------------------------------------------------------ rendering


@contextmanager
def _style() -> Iterator[None]:
    with matplotlib.rc_context(
        {
            # Fixed ids and text as <text> (not paths): the same input gives the same bytes, the files stay
            # small, and a test can read the labels.
            "svg.hashsalt": "flyte-checkpoint-charts",
            "svg.fonttype": "none",
            "font.family": "sans-serif",
            "font.size": 9.0,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "axes.titlesize": 10.0,
            "axes.titleweight": "bold",
            "axes.titlelocation": "left",
        }
    ):
        yield


def render(chart: Chart, results: Path) -> bytes | None:
    """The SVG of ``chart`` from the result files in ``results``; None when its main input is missing."""
    required, *optional = chart.inputs
    if not (results / required).is_file():
        return None
    reports = {required: json.loads((results / required).read_text())}
    for name in optional:
        if (results / name).is_file():
            reports[name] = json.loads((results / name).read_text())
    with _style():
        figure = chart.draw(reports)
        buffer = io.BytesIO()
        figure.savefig(buffer, format="svg", metadata={"Date": None})
    return buffer.getvalue()


def render_all(results: Path, out: Path) -> list[Path]:
    """Render every chart whose inputs exist into ``out``; return the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for chart in CHART_LIST:
        svg = render(chart, results)
        if svg is not None:
            (out / chart.name).write_bytes(svg)
            written.append(out / chart.name)
    return written


def check(results: Path, out: Path) -> list[str]:
    """What differs between the charts in ``out`` and what the results render to (empty: nothing)."""
    problems: list[str] = []
    for chart in CHART_LIST:
        svg = render(chart, results)
        path = out / chart.name
        if svg is None:
            problems.append(f"{chart.name}: {results / chart.inputs[0]} is missing")
        elif not path.is_file():
            problems.append(f"{chart.name}: not rendered into {out}")
        elif path.read_bytes() != svg:
            problems.append(f"{chart.name}: differs from what {results} renders to")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--results", type=Path, default=RESULTS, help=f"result files (default {RESULTS})")
    parser.add_argument("--out", type=Path, default=CHARTS, help=f"where the SVGs go (default {CHARTS})")
    parser.add_argument(
        "--check", action="store_true", help="compare instead of writing; exit 1 on a difference"
    )
    args = parser.parse_args(argv)
    if args.check:
        problems = check(args.results, args.out)
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    for path in render_all(args.results, args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
