"""The cost blocks: the estimator's speed against the floor, the trainer's overhead on CPU (the current SmolLM2
measurements: ``OVERHEAD``), and the GPU's tables (TRL's fused LM head, the trainer on the device)."""

from __future__ import annotations

from research.report.tables import Context, markdown_table

# The current trainer-overhead measurements (SmolLM2-135M + LoRA): JSON stem, configuration, and its row's label.
OVERHEAD = (
    ("overhead_smollm2_on_policy", "smollm2/on-policy", "on-policy, HF `generate`"),
    ("overhead_smollm2", "smollm2/off-policy", "off-policy, `steps_per_generation=2`"),
    ("overhead_smollm2_vllm", "smollm2/vllm-is-policy", "vLLM colocate, IS correction on"),
    ("overhead_smollm2_vllm", "smollm2/vllm-nois-policy", "vLLM colocate, IS correction off"),
)


def _ns(x: float) -> str:
    """Nanoseconds per token: whole numbers on a CPU (20-40), two decimals below 10 (a GPU's fractions of one)."""
    return f"{x:.0f}" if x >= 10 else f"{x:.2f}"


def speed_table(data) -> str:
    names = [k for k in data["results"][0]["median_s"] if k != "floor"]
    rows = [
        [
            f"{r['tokens'] / 1e6:.2f}M",
            f"{r['median_s']['floor'] * 1e3:.1f}",
            *(f"{r['median_s'][n] * 1e3:.1f} ({r['ratio_to_floor'][n]:.2f})" for n in names),
            _ns(r["ns_per_token"]["otb"]),
        ]
        for r in data["results"]
    ]
    header = ["tokens", "floor ms", *(f"{n} ms (x floor)" for n in names), "OTB ns/token"]
    return "\n".join(markdown_table(header, ["---:"] * len(header), rows))


OVERHEAD_HEADER = [
    "config",
    "GRPO step CPU s",
    "OTB step CPU s",
    "OTB/GRPO CPU per pair",
    "median",
    "wall median",
    "peak RSS MB GRPO / OTB",
    "RSS ratio",
]


def _overhead_row(name: str, s: dict) -> list[str]:
    cpu, wall, rss = s["step_cpu_s"], s["step_wall_s"], s["peak_rss_mb"]
    return [
        name,
        f"{cpu['grpo']:.3f}",
        f"{cpu['otb']:.3f}",
        ", ".join(f"{x:.2f}" for x in cpu["pair_ratios"]),
        f"**{cpu['median_ratio']:.2f}**",
        f"{wall['median_ratio']:.2f}",
        f"{rss['grpo']:.0f} / {rss['otb']:.0f}",
        f"{rss['median_ratio']:.3f}",
    ]


def overhead_table(data, names=None) -> str:
    rows = [_overhead_row(n, s) for n, s in data["summary"].items() if names is None or n in names]
    align = ["---", "---:", "---:", "---", "---:", "---:", "---", "---:"]
    return "\n".join(markdown_table(OVERHEAD_HEADER, align, rows))


def overhead_current(ctx: Context) -> str:
    """One table of the current SmolLM2 measurements (``OVERHEAD``), each row naming its JSON."""
    rows = [[*_overhead_row(label, ctx.load(stem)["summary"][name]), ctx.link(stem)] for stem, name, label in OVERHEAD]
    align = ["---", "---:", "---:", "---", "---:", "---:", "---", "---:", "---"]
    return "\n".join(markdown_table([*OVERHEAD_HEADER, "JSON"], align, rows))


def device_fused_head_table(data) -> str:
    """TRL's fused LM head on the GPU with GRPOTrainer's outputs and with OTBTrainer's (plus log sum pi^2)."""
    rows = [
        [
            str(r["length"]),
            r["mode"],
            f"{r['median_s']['grpo'] * 1e3:.1f}",
            f"{r['median_s']['otb'] * 1e3:.1f}",
            f"{r['median_ratio']:.3f}",
            str(len(r["pair_ratios"])),
        ]
        for r in data["results"]
    ]
    header = ["tokens per row", "pass", "GRPO ms", "OTB ms", "OTB/GRPO (median pair)", "pairs"]
    caption = f"{data['meta']['gpu']}, {data['meta']['dtype']}, batch {data['meta']['batch']}, {data['meta']['shape']}"
    return caption + ":\n\n" + "\n".join(markdown_table(header, ["---:", "---", "---:", "---:", "---:", "---:"], rows))


def device_overhead_table(data) -> str:
    """OTBTrainer against GRPOTrainer on the GPU: the pairs that finished, per completion length."""
    rows = [
        [
            length,
            str(s["pairs"]),
            f"{s['step_wall_s']['grpo']:.1f}",
            f"{s['step_wall_s']['otb']:.1f}",
            f"{s['step_wall_s']['median_ratio']:.2f}",
            f"{s['peak_cuda_mb']['grpo']:.0f} / {s['peak_cuda_mb']['otb']:.0f}",
        ]
        for length, s in data["summary"].items()
    ]
    missing = [str(n) for n in data["meta"]["lengths"] if str(n) not in data["summary"]]
    header = ["completion tokens", "pairs", "GRPO step s", "OTB step s", "OTB/GRPO", "peak CUDA MB GRPO / OTB"]
    note = f" No pair finished at {', '.join(missing)} tokens." if missing else ""
    return (
        "\n".join(markdown_table(header, ["---:"] * len(header), rows)) + f"\n\nPairs that finished: the table.{note}"
    )
