"""Prints an Nsight Compute CSV (`ncu --csv --page details`, as gpu_run.sh's profile stage writes
it) as one markdown row per profiled kernel: launch shape, duration, throughputs, occupancy.

    python tools/ncu_table.py profile.csv
"""

from __future__ import annotations

import csv
import sys

COLUMNS = [
    ("Duration", "time"),
    ("DRAM Throughput", "DRAM %"),
    ("Memory Throughput", "mem %"),
    ("Compute (SM) Throughput", "SM %"),
    ("Registers Per Thread", "regs"),
    ("Achieved Occupancy", "occ %"),
    ("Warp Cycles Per Issued Instruction", "cyc/issue"),
]


def short(name: str, width: int = 60) -> str:
    """The kernel's name without return type, namespaces, template arguments and parameters."""
    depth, out = 0, []
    for ch in name.replace("(anonymous namespace)", ""):
        depth += ch == "<"
        if depth == 0:
            out.append(ch)
        depth -= ch == ">"
    base = "".join(out).split("(")[0].split()[-1]
    return base.split("::")[-1][:width]


def main(path: str) -> None:
    kernels: dict[str, dict] = {}
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]  # ncu's own lines are not CSV
    for row in csv.DictReader(lines):
        k = kernels.setdefault(
            row["ID"],
            {
                "name": short(row["Kernel Name"]),
                "grid": row["Grid Size"],
                "block": row["Block Size"],
            },
        )
        k[row["Metric Name"]] = f"{row['Metric Value']} {row['Metric Unit']}".strip()
    header = ["id", "kernel", "grid", "block"] + [label for _, label in COLUMNS]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for kid, k in kernels.items():
        cells = [kid, k["name"], k["grid"], k["block"]]
        cells += [k.get(metric, "") for metric, _ in COLUMNS]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
