"""The bench's text: the table of each configuration as it runs, the summary, and the
Markdown report and PNG chart of a run (from the results' JSON content)."""

IMPL_ORDER = ("rnncore", "torch", "onnxruntime", "mlx", "numpy")


def cpu_description(machine):
    """The processor as the reports name it: model name, then family, model and caches
    where recorded ("AMD EPYC (Zen 5: family 26 model 2; L1d 48K, L2 1024K a core)")."""
    parts = []
    if machine.get("cpu_family") is not None:
        arch = machine.get("cpu_microarchitecture")
        fam = f"family {machine['cpu_family']} model {machine.get('cpu_model_number')}"
        parts.append(f"{arch}: {fam}" if arch else fam)
    caches = machine.get("cpu_caches") or {}
    per_core = [f"{k} {caches[k]}" for k in ("L1d", "L2") if k in caches]
    if per_core:
        parts.append(", ".join(per_core) + " a core")
    if "L3" in caches:
        parts.append(f"L3 {caches['L3']}")
    return machine["cpu_model"] + (f" ({'; '.join(parts)})" if parts else "")


def fmt_ms(seconds):
    ms = 1e3 * seconds
    if ms >= 100:
        return f"{ms:.0f}"
    if ms >= 10:
        return f"{ms:.1f}"
    if ms >= 1:
        return f"{ms:.2f}"
    return f"{ms:.3f}"


def index(results):
    """{(config, mode, threads): {impl: record}}, in run order."""
    rows = {}
    for r in results["results"]:
        rows.setdefault((r["config"], r["mode"], r["threads"]), {})[r["impl"]] = r
    return rows


def impls_present(results):
    seen = {r["impl"] for r in results["results"]}
    return [name for name in IMPL_ORDER if name in seen]


def timed(record):
    return record is not None and record["status"] == "ok"


def add_ratios(records):
    """Set each timed peer's "ratio": rnncore's time / the peer's, at the same mode and
    thread count."""
    ours = {(r["mode"], r["threads"]): r for r in records if r["impl"] == "rnncore"}
    for r in records:
        own = ours.get((r["mode"], r["threads"]))
        if r["impl"] != "rnncore" and timed(r) and timed(own):
            r["ratio"] = own["median_s"] / r["median_s"]


def check_text(r):
    if r["status"] == "ok":
        c = r["check"]
        text = f"ok (err {c['max_rel_err']:.1e} <= {c['tolerance']:.0e}; {r['reps']} runs"
        text += f"; others {r['other_cpu']})" if r.get("other_cpu") is not None else ")"
        if r.get("model_s") is not None:
            text += f"; model {r['model_gpu']} {fmt_ms(r['model_s'])} ms"
        return text + (" *" if r.get("disturbed") else "")
    return f"{r['status']}: {r['note']}"


def config_table(title, records, show_threads=False):
    """The text table of one configuration: mode, implementation, median ms, ratio rnncore
    / peer and the check."""
    header = ("mode", "threads", "implementation", "ms", "rnncore/peer", "check")
    table = [header]
    for r in records:
        ms = fmt_ms(r["median_s"]) if timed(r) else "-"
        ratio = f"{r['ratio']:.2f}" if r.get("ratio") is not None else "-"
        table.append((r["mode"], str(r["threads"]), r["where"], ms, ratio, check_text(r)))
    keep = [i for i in range(len(header)) if show_threads or header[i] != "threads"]
    widths = {i: max(len(row[i]) for row in table) for i in keep}
    lines = [title]
    for row in table:
        cells = [row[i].rjust(widths[i]) if i in (3, 4) else row[i].ljust(widths[i]) for i in keep]
        lines.append("  " + "  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


def summary(results):
    """The closing lines: failures, peer errors, disturbed measurements, PASS or FAIL."""
    records = results["results"]
    lines = []
    for r in records:
        if r["status"] == "FAILED-CHECK" or (r["status"] == "error" and r["impl"] == "rnncore"):
            lines.append(f"FAIL {r['config']} {r['mode']} {r['where']}: {r['note']}")
    for r in records:
        if r["status"] == "error" and r["impl"] != "rnncore":
            lines.append(
                f"peer error (not a failure) {r['config']} {r['mode']} {r['where']}: {r['note']}"
            )
    disturbed = [r for r in records if r.get("disturbed")]
    if disturbed:
        others = sorted(r["other_cpu"] for r in disturbed)
        lines.append(
            f"warning: {len(disturbed)} of {sum(timed(r) for r in records)} measurements ran "
            f"while other processes kept cores busy (median {others[len(others) // 2]:.1f} "
            "cores, marked *): their times and ratios are unreliable"
        )
    agreed = sum(r["status"] == "ok" for r in records)
    failed = sum(r["status"] == "FAILED-CHECK" for r in records)
    lines.append(
        f"{'PASS' if results['passed'] else 'FAIL'}: {agreed} implementation run(s) agreed "
        f"with the reference, {failed} disagreed, in {results['seconds']:.1f} s"
    )
    return "\n".join(lines)


def loaded_line(r):
    return (
        f"  {r['config']:24} {r['mode']:9} default ({r['default_threads']}t) "
        f"{1e3 * r['default_median_s']:10.3f} ms  1t {1e3 * r['single_median_s']:10.3f} ms  "
        f"ratio {r['ratio']:.2f}  others {r['other_cpu']}  "
        f"{'same bits' if r['same_bits'] else 'BITS DIFFER'}"
    )


def cell(record):
    if record is None or record["status"] == "n/a":
        return "—"
    if record["status"] != "ok":
        return record["status"]
    text = fmt_ms(record["median_s"]) + ("*" if record.get("disturbed") else "")
    if record.get("cpu_use", 0) > record["threads"] + 0.3:
        text += "†"
    if record.get("model_s") is not None:  # Metal: the cost model's time beside it
        text += f" (model {record['model_gpu']} {fmt_ms(record['model_s'])})"
    return text


def fastest_peer(row):
    """The fastest peer that passed the check (only those are timed)."""
    peers = [r for name, r in row.items() if name != "rnncore" and timed(r)]
    return min(peers, key=lambda r: r["median_s"]) if peers else None


def gemm_peaks(results):
    return {w["threads"]: w["gemm"] for w in results["workers"] if "gemm" in w}


LIBRARY_NAMES = {"numpy": "numpy", "torch": "torch", "onnxruntime": "ONNX Runtime"}


def gemm_line(p):
    """One worker's GEMM measurements (bench.gemm_peak) in a line."""

    def each(d, prefix=""):
        return ", ".join(
            f"{label} {d[f'{prefix}{name}_gflops']}"
            for name, label in LIBRARY_NAMES.items()
            if f"{prefix}{name}_gflops" in d
        )

    parts = [
        f"SGEMM {p.get('sgemm_peak_gflops', '?')} GFLOP/s ({each(p, 'sgemm_')}), "
        f"DGEMM {p.get('dgemm_peak_gflops', '?')} ({each(p, 'dgemm_')})"
    ]
    if "bf16gemm_torch_gflops" in p:
        parts.append(f"bfloat16 by torch {p['bf16gemm_torch_gflops']}")
    for label, d in p.get("sgemm_shapes", {}).items():
        parts.append(f"float32 {label} [{d['m']}×{d['k']}]·[{d['k']}×{d['n']}]: {each(d)}")
    return "; ".join(parts) + "."


# A round trip of the bench's probe (cpu_round_trip_ns) longer than this: the two CPUs are
# far apart. On a Zen 4 VM in December 2026 the probe took 0.31-0.45 us where a C loop's
# round trip took 0.05-0.12, and 0.66-0.78 (once 1.2) where it took 0.47-0.52.
FAR_ROUND_TRIP_NS = 550


def availability_line(avail):
    """The probe's result in words, with a warning when the CPUs ran short or unevenly."""
    if not avail:
        return None
    ran = ", ".join(f"{r:.2f}" for r in avail["ran"])
    speed = ", ".join(f"{r:.2f}" for r in avail["speed"])
    line = f"CPUs all busy: each ran {ran} of the time, at speeds {speed} of the fastest"
    rtt = avail.get("round_trip_ns")
    if rtt:
        line += f"; a round trip between the first two {rtt / 1e3:.2f} us"
    notes = []
    if min(avail["ran"]) < 0.9:
        notes.append("the CPUs are taken part of the time (other processes, a quota, a VM's host)")
    if min(avail["speed"]) < 0.8:
        notes.append("they run at different speeds (a core shared with another guest, or kinds)")
    if rtt and rtt > FAR_ROUND_TRIP_NS:
        notes.append("they are far apart (another core complex or socket): threads hand off slowly")
    if notes:
        line += f" (warning: {'; '.join(notes)}; times and ratios are not a quiet machine's)"
    return line


def markdown(results):
    names = impls_present(results)
    peaks = gemm_peaks(results)
    dtypes = {c["name"]: c["dtype"] for c in results["configs"]}
    m, v = results["machine"], results["versions"]
    lines = [
        "# rnncore benchmark",
        "",
        f"{results['date']} · `{results['command']}` · {results['run']} run, "
        f"{results['seconds']:.0f} s",
        "",
        f"Machine: {cpu_description(m)}, {m.get('usable_cpus', m['logical_cpus'])} usable CPUs, "
        f"{m['platform']}. Versions: "
        + ", ".join(f"{k} {val}" for k, val in v.items() if val and k != "matplotlib")
        + ".",
        "",
        f"rnncore device: {results['device']}"
        + (
            f" (CPU kernels: {results['build_info']['kernels']})"
            if results.get("build_info", {}).get("kernels") and results["device"] == "cpu"
            else ""
        )
        + ". OpenBLAS overrides in the environment: "
        + (", ".join(f"{k}={val}" for k, val in m["openblas_overrides"].items() if val) or "none")
        + ".",
        "",
    ]
    for when in ("before", "after"):
        line = availability_line(results.get(f"cpu_availability_{when}"))
        if line:
            lines += [f"{when.capitalize()} the run, a busy loop pinned to each CPU: {line}.", ""]
    if peaks:
        lines += ["GEMM 2048² peak (the best of numpy's OpenBLAS, torch and ONNX Runtime's MLAS):"]
        lines += [f"- {t} thread(s): {gemm_line(p)}" for t, p in peaks.items()]
        lines += [""]
    lines += [
        "## Median time per call (ms)",
        "",
        "Training = forward with training on + backward (gradients of input, weights and "
        "biases). In float16 and bfloat16 configurations ONNX Runtime runs float32 on the same "
        "values (its CPU operators have neither type), in the same rounds. "
        "Ratio = rnncore / fastest peer (below 1: rnncore is faster). GFLOP/s counts "
        "2·T·N·G·H·(I+H) per direction for the forward and 3× that for training"
        + (
            "; % is of the GEMM peak above (SGEMM, or DGEMM for float64) at the same thread count."
            if peaks
            else " (no GEMM peak measured: full runs on the CPU measure it)."
        ),
        "",
        "| config | mode | threads | "
        + " | ".join(f"{n} ms" for n in names)
        + " | fastest peer | rnncore / fastest | rnncore GFLOP/s (% peak) |",
        "|" + "---|" * (3 + len(names) + 3),
    ]
    rows = index(results)
    for (config, mode, threads), row in rows.items():
        own = row.get("rnncore")
        best = fastest_peer(row)
        ratio = (
            f"{own['median_s'] / best['median_s']:.2f}" if timed(own) and best is not None else "—"
        )
        gflops = "—"
        if timed(own):
            prefix = "dgemm" if dtypes.get(config) == "float64" else "sgemm"
            peak = peaks.get(threads, {}).get(f"{prefix}_peak_gflops")
            share = f" ({100 * own['gflops'] / peak:.0f}%)" if peak else ""
            gflops = f"{own['gflops']:.1f}{share}"
        lines.append(
            f"| {config} | {mode} | {threads} | "
            + " | ".join(cell(row.get(n)) for n in names)
            + f" | {best['impl'] if best else '—'} | {ratio} | {gflops} |"
        )

    thread_counts = sorted({t for (_, _, t) in rows})
    if len(thread_counts) >= 2:
        lo, hi = thread_counts[0], thread_counts[-1]
        lines += [
            "",
            f"## {hi} threads vs {lo} thread{'s' if lo > 1 else ''}: speedup "
            f"(time at {lo} / time at {hi})",
            "",
            "| config | mode | " + " | ".join(f"{n}" for n in names) + " |",
            "|" + "---|" * (2 + len(names)),
        ]
        for config, mode in dict.fromkeys((c, mo) for (c, mo, _) in rows):
            cells = []
            for n in names:
                a = rows.get((config, mode, lo), {}).get(n)
                b = rows.get((config, mode, hi), {}).get(n)
                cells.append(
                    f"{a['median_s'] / b['median_s']:.2f}" if timed(a) and timed(b) else "—"
                )
            lines.append(f"| {config} | {mode} | " + " | ".join(cells) + " |")

    lines += [
        "",
        "## Agreement: largest relative error against the float64 reference",
        "",
        f"Reference: {reference_name(results)}; over all thread counts and fields (output, and "
        "for training the gradients of input, weights, biases). Tolerance: "
        + ", ".join(f"{k} {val:g}" for k, val in results["settings"]["tolerance"].items())
        + ".",
        "",
        "| config | mode | " + " | ".join(names) + " |",
        "|" + "---|" * (2 + len(names)),
    ]
    worst = {}
    for r in results["results"]:
        if "check" in r:
            key = (r["config"], r["mode"], r["impl"])
            worst[key] = max(worst.get(key, 0.0), r["check"]["max_rel_err"])
    for config, mode in dict.fromkeys((c, mo) for (c, mo, _) in rows):
        cells = [
            f"{worst[(config, mode, n)]:.1e}" if (config, mode, n) in worst else "—" for n in names
        ]
        lines.append(f"| {config} | {mode} | " + " | ".join(cells) + " |")

    lines += ["", "## Notes", ""] + [f"- {note}" for note in notes(results)]
    return "\n".join(lines) + "\n"


def loaded_markdown(results):
    """The table of a --loaded run: rnncore at its default thread count and at 1 thread
    beside one competing CPU-bound process."""
    m = results["machine"]
    n = results["default_threads"]
    rounds = results["records"][0]["rounds"] if results["records"] else "?"
    lines = [
        "# rnncore on a loaded machine",
        "",
        f"{results['date']} · `{results['command']}` · {results['run']} run, "
        f"{results['seconds']:.0f} s",
        "",
        f"Machine: {cpu_description(m)}, {m.get('usable_cpus', m['logical_cpus'])} usable CPUs, "
        f"{m['platform']}. Competitor: {results['competitor']}.",
        "",
        f"Each configuration and mode timed at rnncore's default thread count ({n}) and at 1 "
        f"thread in the same process, {rounds} alternating rounds (median of each round's "
        "median). Ratio = default / 1 thread "
        "(target: at most 1.3). Others = cores kept busy by other processes during the "
        "measurements (the competitor alone is about 1).",
        "",
        f"| config | mode | {n} threads ms | 1 thread ms | ratio | rounds' ratios | others "
        "| bits |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results["records"]:
        rr = r["round_ratios"]
        lines.append(
            f"| {r['config']} | {r['mode']} | {fmt_ms(r['default_median_s'])} | "
            f"{fmt_ms(r['single_median_s'])} | {r['ratio']:.2f} | "
            f"{min(rr):.2f}–{max(rr):.2f} | {r['other_cpu']} | "
            f"{'same' if r['same_bits'] else 'DIFFER'} |"
        )
    worst = max((r["ratio"] for r in results["records"]), default=float("nan"))
    lines += ["", f"Worst ratio: {worst:.2f}."]
    return "\n".join(lines) + "\n"


def reference_name(results):
    for w in results["workers"]:
        if "reference" in w:
            return w["reference"]
    return "?"


def notes(results):
    out = [
        "ONNX Runtime has no training for its RNN/GRU/LSTM operators: inference only. "
        "The numpy loop is a per-step loop with one GEMM for the input projection, and a "
        "hand-written BPTT for training.",
    ]
    if results["settings"]["threads"]:
        out.append(
            "Each thread count n ran in its own process with RNNCORE_NUM_THREADS, "
            "OPENBLAS_NUM_THREADS, OMP_NUM_THREADS and MKL_NUM_THREADS set to n, "
            "torch.set_num_threads(n) and ONNX Runtime intra_op_num_threads = n."
        )
    else:
        out.append("Every library ran in one process at its default thread count.")
    if any(r["impl"] == "mlx" for r in results["results"]):
        out.append("MLX's CPU threads are not set by this script (MLX has no such setting).")
    builds = {w["rnncore_build"]["sha256"] for w in results["workers"] if "rnncore_build" in w}
    if len(builds) > 1:
        out.append(
            "The thread counts ran different rnncore builds (it was reinstalled during the "
            "run): compare them with care."
        )
    for w in results["workers"]:
        if w.get("failed"):
            out.append(
                f"The {w['threads']}-thread run failed (exit code {w.get('exit_code')}) after "
                f"{w.get('configs_done', 0)} configuration(s); their results are kept."
            )
            continue
        s = w.get("thread_settings", {})
        if w.get("threads_set") and s.get("torch_threads", w["threads"]) != w["threads"]:
            out.append(f"{w['threads']}-thread run: torch reported {s['torch_threads']} threads.")
        for name, why in w.get("missing_peers", {}).items():
            out.append(f"{name} not measured: {why}.")
    over = [r for r in results["results"] if r.get("cpu_use", 0) > r["threads"] + 0.3]
    if over:
        out.append(
            "† used more cores than its thread setting (CPU time / wall time): "
            + "; ".join(
                f"{r['impl']} {r['config']} {r['mode']} {r['threads']}t ({r['cpu_use']:.2f})"
                for r in over
            )
            + "."
        )
    disturbed = [r for r in results["results"] if r.get("disturbed")]
    if disturbed:
        out.append(
            f"* {len(disturbed)} measurement(s) ran while other processes kept cores busy "
            "(after retries; see other_cpu in results.json): their times are unreliable."
        )
    problems = [r for r in results["results"] if r["status"] in ("error", "FAILED-CHECK")]
    for r in problems:
        what = r.get("note") or f"relative error {r['check']['max_rel_err']:.1e}"
        out.append(f"{r['status']}: {r['impl']} {r['config']} {r['mode']} {r['threads']}t — {what}")
    return list(dict.fromkeys(out))


def chart(results, path):
    """Grouped bars of median time per configuration, one panel per mode × threads."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = impls_present(results)
    rows = index(results)
    if not rows:
        raise ValueError("no timed results to chart")
    modes = list(dict.fromkeys(m for (_, m, _) in rows))
    threads = sorted({t for (_, _, t) in rows})
    configs = list(dict.fromkeys(c for (c, _, _) in rows))
    panels = [(mode, t) for mode in modes for t in threads]
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(0.9 * len(configs) + 4, 3.6 * len(panels)), squeeze=False
    )
    width = 0.8 / len(names)
    colors = dict(zip(IMPL_ORDER, ("tab:red", "tab:blue", "tab:green", "tab:purple", "tab:gray")))
    for (mode, t), (ax,) in zip(panels, axes):
        for k, name in enumerate(names):
            xs, ys, failed = [], [], []
            for c_idx, config in enumerate(configs):
                r = rows.get((config, mode, t), {}).get(name)
                if timed(r):
                    xs.append(c_idx + (k - (len(names) - 1) / 2) * width)
                    ys.append(1e3 * r["median_s"])
                    failed.append(r["status"] != "ok")
            bars = ax.bar(xs, ys, width, label=name, color=colors[name])
            for bar, bad in zip(bars, failed):
                if bad:
                    bar.set_hatch("xx")
        ax.set_yscale("log")
        ax.set_title(f"{mode}, {t} thread{'s' if t > 1 else ''}", fontsize=10)
        ax.set_xticks(range(len(configs)))
        ax.set_xticklabels(configs, rotation=25, ha="right", fontsize=8)
        ax.grid(axis="y", which="both", alpha=0.3)
        ax.set_ylabel("median ms per call")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(
        f"rnncore vs peers — {cpu_description(results['machine'])} "
        "(hatched: failed the agreement check)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
