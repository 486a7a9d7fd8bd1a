"""How a harness run reads for people: the Markdown summary and the SVG chart of a results.json
document (`arms.build_results`). Pure: text in, text out."""

from __future__ import annotations

from .arms import failure_reasons, finite_or_none


def _f(x, nd=2):
    return "—" if x is None else f"{x:.{nd}f}"


def render_console(doc: dict, paths: dict) -> str:
    """The table the bench and ladder commands print: per configuration the passing arms out of
    all, medians and ratios to the control ('-' where no arm passed), then where the files are."""
    def f(v, nd=2):
        return "-" if v is None else f"{v:.{nd}f}"

    lines = [f"{'arm':10} {'ok':>5} {'prefill tok/s':>13} {'x':>6} {'gen tok/s':>10} {'x':>6} "
             f"{'steady tok/s':>12} {'x':>6}"]
    for a in doc["arms"]:
        m, g = doc["medians"][a], doc["gains"][a]
        lines.append(f"{a:10} {m['n']:>2}/{m['n'] + m['n_failed']:<2} {f(m['prefill_tps']):>13} "
                     f"{f(g['prefill_tps']):>6} {f(m['gen_tps']):>10} {f(g['gen_tps']):>6} "
                     f"{f(m['gen_steady_tps']):>12} {f(g['gen_steady_tps']):>6}")
    lines.append(f"ratios vs control {doc['control']}; results {paths['results']}; summary {paths['summary']}; "
                 f"chart {paths['chart']}")
    return "\n".join(lines) + "\n"


def render_failures(doc: dict) -> str:
    """One line per failed arm, in run order and numbered as the progress lines are (arm 2/8):
    every gate it failed and why."""
    lines = []
    for r in doc["rows"]:
        if not r["ok"]:
            why = "; ".join(f"{gate}: {reason}" for gate, reason in failure_reasons(r))
            lines.append(f"arm {r['seq'] + 1}/{len(doc['rows'])} {r['arm']} FAILED {why}")
    return "".join(line + "\n" for line in lines)


def render_idle(doc: dict) -> str:
    """One note per configuration and source the split gave nothing in a phase (a run's `idle`
    entries of kind 'split', which pass the plan gate), so a drive that sat out is never silent.
    Sources given bytes that read nothing fail the plan gate and are in `render_failures`."""
    seen: dict[tuple, str] = {}
    for r in doc["rows"]:
        for e in r.get("idle") or ():
            if e.get("kind") == "split":
                seen.setdefault((r["arm"], e["phase"], e["source"]), e["message"])
    return "".join(f"note: {arm}: {msg}\n" for (arm, _, _), msg in seen.items())


def render_markdown(doc: dict) -> str:
    ctl = doc["control"]
    s = doc["settings"]
    lines = [f"# Harness run {doc['created']}", "",
             f"Order **{doc['order']}**: {' '.join(doc['sequence'])}. Control **{ctl}**, reference hash from "
             f"**{doc['reference']}** (`{(doc['reference_sha256'] or 'none')[:16]}`). "
             f"Prompt {s.get('prompt_tokens')} tokens, {s.get('gen_tokens')} generated, cache "
             f"{s.get('cache_experts')} experts.", "",
             "## Medians per configuration (passing arms only)", "",
             "| arm | sources | prefill w | decode w | n ok | n failed | prefill tok/s | x | gen tok/s | x "
             "| steady tok/s | x | first ms | misses/token |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for a, spec in doc["arms"].items():
        m, g = doc["medians"][a], doc["gains"][a]
        lines.append(f"| {a} | {len(spec['sources'])} | {':'.join(map(str, spec['prefill_weights']))} | "
                     f"{':'.join(map(str, spec['decode_weights']))} | {m['n']} | {m['n_failed']} | "
                     f"{_f(m['prefill_tps'])} | {_f(g['prefill_tps'])} | {_f(m['gen_tps'])} | {_f(g['gen_tps'])} | "
                     f"{_f(m['gen_steady_tps'])} | {_f(g['gen_steady_tps'])} | {_f(m['gen_first_ms'], 1)} | "
                     f"{_f(m['misses_per_token'])} |")
    if doc["claims"]:
        lines += ["", "## Claims (a gain only when every pair agrees)", ""]
        for a, cl in doc["claims"].items():
            lines.append(f"- **{a}** vs {ctl}: prefill {cl['prefill_tps']}, generation {cl['gen_tps']}, "
                         f"steady {cl['gen_steady_tps']}")
    lines += ["", "## Pairs", "", "| arm (seq) | control (seq) | Δ prefill tok/s | Δ gen tok/s | Δ steady tok/s |",
              "|---|---|---|---|---|"]
    for p in doc["pairs"]:
        lines.append(f"| {p['arm']} ({p['seq']}) | {ctl} ({p['control_seq']}) | {_f(p['prefill_tps_delta'])} | "
                     f"{_f(p['gen_tps_delta'])} | {_f(p['gen_steady_tps_delta'])} |")
    lines += ["", "## Arms in run order", "", "| seq | arm | status | prefill tok/s | steady tok/s | sha256 | gates |",
              "|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        status = "ok" if r["ok"] else "FAILED: " + ", ".join(r["failed"])
        why = "; ".join(f"{n}: {g['detail']}" for n, g in r["gates"].items() if not g["ok"]) or r["error"] or ""
        lines.append(f"| {r['seq']} | {r['arm']} | {status} | {_f(r['metrics'].get('prefill_tps'))} | "
                     f"{_f(r['metrics'].get('gen_steady_tps'))} | `{(r['output_sha256'] or '')[:12]}` | {why} |")
    return "\n".join(lines) + "\n"


def _esc(t: str) -> str:
    return str(t).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def render_svg(doc: dict, width: int = 760, height: int = 360) -> str:
    """Two panels (prefill tok/s, steady decode tok/s): a bar per configuration at its median,
    a dot per passing arm, a cross per failed arm, the ratio to the control above each bar."""
    arms = list(doc["arms"])
    panels = (("prefill_tps", "prefill tok/s"), ("gen_steady_tps", "steady decode tok/s"))
    pw = (width - 60) / len(panels)
    top, bottom = 50, height - 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14">{_esc(doc["order"])} '
           f'{_esc(" ".join(doc["sequence"]))} — control {_esc(doc["control"])}</text>']
    colors = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948")
    for pi, (key, label) in enumerate(panels):
        x0 = 40 + pi * pw
        vals = [finite_or_none(r["metrics"].get(key)) for r in doc["rows"]]
        vmax = max([v for v in vals if v is not None] + [1e-9])
        scale = (bottom - top) / (vmax * 1.15)
        out.append(f'<text x="{x0 + pw / 2}" y="{top - 10}" text-anchor="middle">{_esc(label)}</text>')
        out.append(f'<line x1="{x0}" y1="{bottom}" x2="{x0 + pw - 20}" y2="{bottom}" stroke="#333"/>')
        out.append(f'<line x1="{x0}" y1="{top}" x2="{x0}" y2="{bottom}" stroke="#333"/>')
        out.append(f'<text x="{x0 - 4}" y="{top + 4}" text-anchor="end" font-size="10">{vmax * 1.15:.3g}</text>')
        bw = (pw - 40) / max(1, len(arms))
        for ai, a in enumerate(arms):
            bx = x0 + 10 + ai * bw
            med = doc["medians"][a].get(key)
            if med is not None:
                h = med * scale
                out.append(f'<rect x="{bx + bw * 0.15:.1f}" y="{bottom - h:.1f}" width="{bw * 0.7:.1f}" '
                           f'height="{h:.1f}" fill="{colors[ai % len(colors)]}" fill-opacity="0.75"/>')
                ratio = doc["gains"][a].get(key)
                tag = f"{med:.3g}" + (f" ({ratio:.2f}x)" if ratio is not None and a != doc["control"] else "")
                out.append(f'<text x="{bx + bw / 2:.1f}" y="{bottom - h - 4:.1f}" text-anchor="middle" '
                           f'font-size="10">{_esc(tag)}</text>')
            for r in doc["rows"]:
                v = finite_or_none(r["metrics"].get(key)) if r["arm"] == a else None
                if v is None:
                    continue
                cx, cy = bx + bw / 2, bottom - v * scale
                if r["ok"]:
                    out.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="3" fill="#222"/>')
                else:
                    out.append(f'<path d="M{cx - 4:.1f},{cy - 4:.1f} L{cx + 4:.1f},{cy + 4:.1f} M{cx - 4:.1f},'
                               f'{cy + 4:.1f} L{cx + 4:.1f},{cy - 4:.1f}" stroke="#c00" stroke-width="1.5"/>')
            out.append(f'<text x="{bx + bw / 2:.1f}" y="{bottom + 15}" text-anchor="middle">{_esc(a)}</text>')
    out.append(f'<text x="{width / 2}" y="{height - 6}" text-anchor="middle" font-size="10">bars: medians of '
               f'passing arms; dots: passing arms; crosses: failed arms (kept, excluded from medians)</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
