"""Markdown for docs/performance.md: the ratio table of one benchmark run.

Only the part between ``<!-- bench:start -->`` and ``<!-- bench:end -->`` is replaced, so the
hand-written analysis around it (profile, where the time goes) survives a re-run.
"""

from __future__ import annotations

import platform
import statistics
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

START, END = "<!-- bench:start -->", "<!-- bench:end -->"

TARGETS = [
    # (target, connections, what, limit, higher is better)
    ("REST JSON", 16, "requests/s", 10_000, True),
    ("REST JSON", 1, "p50 us", 200, False),
    ("REST binary", 1, "added p50 us", 200, False),
]


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def summarize(runs: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    """Median (and range) over rounds, per (target, connections), in first-seen order."""
    grouped: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for run in runs:
        grouped.setdefault((run["target"], run["connections"]), []).append(run)
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for key, group in grouped.items():
        rps = [r["rps"] for r in group]
        cpu = [r["cpu_us_per_request"] for r in group if r["cpu_us_per_request"]]
        out[key] = {
            "rps": _median(rps),
            "rps_min": min(rps),
            "rps_max": max(rps),
            "p50": _median([r["latency_us"]["p50"] for r in group]),
            "p99": _median([r["latency_us"]["p99"] for r in group]),
            "cpu": _median(cpu) if cpu else None,
            "errors": sum(sum(r["errors"].values()) for r in group),
        }
    return out


def render(runs: list[dict[str, Any]], ort_runs: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    rows = summarize(runs)
    ort_rate = _median([o["calls_per_s"] for o in ort_runs])
    ort_p50 = _median([o["latency_us"]["p50"] for o in ort_runs])
    ort_p99 = _median([o["latency_us"]["p99"] for o in ort_runs])
    noop = {c: s for (t, c), s in rows.items() if t == "do-nothing ASGI (uvicorn)"}
    lines = [
        START,
        f"Measured {time.strftime('%Y-%m-%d %H:%M')} on {machine()}; "
        f"Python {platform.python_version()}, onnxruntime {version('onnxruntime')}, "
        f"litestar {version('litestar')}, uvicorn {version('uvicorn')}, "
        f"orjson {version('orjson')}.",
        "",
        f"Reproduce: `{meta['command']}` (server side pinned to CPU 0 with `taskset -c 0`, "
        f"`wrk -t1` pinned to CPU 1; {meta['duration']:g} s per run, {meta['repeat']} interleaved "
        f"rounds, medians shown, requests/s range in brackets). Load average before/after: "
        f"{meta['load_before']} / {meta['load_after']} (the machine is shared; compare rows "
        "of this table with each other, not with other runs).",
        "",
        f"Raw onnxruntime (`session.run`, batch 1, in-process, CPU 0, intra-op threads "
        f"{meta['intra_op_threads']}): **{ort_rate:,.0f} calls/s**, p50 {ort_p50:.1f} us, "
        f"p99 {ort_p99:.1f} us.",
        "",
        "| configuration | conns | requests/s | p50 us | p99 us | server CPU us/req | "
        "x raw ORT time | added p50 us | % of do-nothing ASGI |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (target, conns), s in rows.items():
        cpu = f"{s['cpu']:.1f}" if s["cpu"] else "-"
        ceiling = noop.get(conns)
        share = f"{100 * s['rps'] / ceiling['rps']:.0f}%" if ceiling else "-"
        errors = f" ({s['errors']} errors)" if s["errors"] else ""
        added = f"{s['p50'] - ort_p50:.0f}" if conns == 1 else "-"  # at c16 p50 is mostly queueing
        lines.append(
            f"| {target}{errors} | {conns} | {s['rps']:,.0f} [{s['rps_min']:,.0f}-"
            f"{s['rps_max']:,.0f}] | {s['p50']:.0f} | {s['p99']:.0f} | {cpu} | "
            f"{ort_rate / s['rps']:.1f} | {added} | {share} |"
        )
    lines += [
        "",
        "`x raw ORT time`: raw onnxruntime calls/s divided by the row's requests/s. `added p50` "
        "(one connection only): the row's p50 as wrk sees it (loopback TCP, HTTP, framework, "
        "codec, dataplane, model) minus raw onnxruntime's p50. `server CPU us/req`: CPU time of "
        "the server process(es) during the run divided by requests served; 1e6 / that is what "
        "one idle core could serve.",
        "",
        "Targets (issue 2, item 10):",
        "",
    ]
    for target, conns, what, limit, higher in TARGETS:
        row = rows.get((target, conns))
        if row is None:
            continue
        measured = {"requests/s": row["rps"], "p50 us": row["p50"]}
        value = measured.get(what, row["p50"] - ort_p50)  # else: added p50 us
        met = value >= limit if higher else value <= limit
        sign = ">=" if higher else "<="
        lines.append(
            f"- {target} c{conns} {what} {sign} {limit:,}: measured {value:,.0f} "
            f"({'met' if met else 'NOT met'})"
        )
    lines += ["", END]
    return "\n".join(lines)


def machine() -> str:
    model = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    import os

    return f"{os.cpu_count()} x {model} ({platform.system()} {platform.release()})"


def write_section(path: Path, section: str, start: str = START, end: str = END) -> None:
    """Replace the section of ``path`` between ``start`` and ``end`` (or append it) and keep
    everything else (``section`` carries the markers itself)."""
    text = path.read_text() if path.exists() else "# Performance\n\n"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        tail = rest.split(end, 1)[1]
        text = head + section + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
