"""`python -m aphrodite_ext info|plan`: what this install holds, and the build plan."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import aphrodite_ext


def _table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
    return "\n".join([line(header), line(tuple("-" * w for w in widths)), *map(line, rows)])


def plan_table(plan: dict) -> str:
    """Families by module: built for which archs (and the generator options that narrowed
    it), or skipped and why; then sources."""
    rows = []
    for name, fam in plan["families"].items():
        status = "built: " + " ".join(fam["archs"]) if fam["built"] else "skipped: " + fam["reason"]
        if fam["built"] and fam.get("generator_options"):
            status += " (" + "; ".join(fam["generator_options"]) + ")"
        rows.append((fam["module"], name, str(len(fam["sources"])), status))
    out = [
        f"backend {plan['backend']}, archs {' '.join(plan['archs'])}, "
        f"torch {plan['torch']['full']}, {plan['toolchain']['build_type']}",
        "",
        _table(rows, ("module", "family", "sources", "status")),
        "",
    ]
    mods = [
        (m, "built" if i["built"] else "skipped: " + i["reason"])
        for m, i in plan["modules"].items()
    ]
    out.append(_table(mods, ("module", "status")))
    return "\n".join(out)


def info_text() -> str:
    info = aphrodite_ext.build_info()
    if not info:
        return (
            "aphrodite_ext "
            + aphrodite_ext.__version__
            + ": "
            + aphrodite_ext.module_status("_C")[1]
        )
    import torch

    lines = [
        f"aphrodite_ext {aphrodite_ext.__version__}",
        f"backend: {info['backend']}   archs: {' '.join(info['archs'])}",
        f"torch: built against {info['torch']['full']}, running {torch.__version__}",
    ]
    try:
        aphrodite_ext.check_runtime_knobs()
        aphrodite_ext.check_build_info()
        mismatch = None
    except (ValueError, aphrodite_ext.BuildMismatchError) as e:  # ValueError: a run-time knob
        mismatch = str(e)
        lines.append(f"no module can load: {mismatch}")
    if torch.cuda.is_available():
        cap = "{}.{}".format(*torch.cuda.get_device_capability())
        lines.append(f"GPU: {torch.cuda.get_device_name()} (sm {cap})")
    rows = []
    for module in aphrodite_ext.MODULES:
        ok, why = aphrodite_ext.module_status(module)
        isa_error = None
        if ok and not mismatch:
            aphrodite_ext.load(module)
            if info["backend"] == "cpu":
                isa = getattr(torch.ops, module).cpu_isa()
                if isa.startswith("error: "):  # APHRODITE_CPU_ISA names no build this CPU runs
                    isa_error = isa.removeprefix("error: ")
                    lines.append(f"{module}: CPU kernels cannot run: {isa_error}")
                else:
                    lines.append(f"{module}: CPU kernels run the {isa} build")
        for fam_name, fam in info["families"].items():
            if fam["module"] != module:
                continue
            status = "available" if fam["built"] else "unavailable: " + fam["reason"]
            if fam["built"] and (mismatch or isa_error):
                status = "unavailable: " + ("built for another torch" if mismatch else isa_error)
            rows += [(module, op, fam_name, status) for op in fam["ops"]]
    return "\n".join(lines + ["", _table(rows, ("module", "op", "family", "status"))])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m aphrodite_ext", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="backend, archs, modules, and every op with its availability")
    plan = sub.add_parser("plan", help="the build plan as a table")
    plan.add_argument(
        "path", nargs="?", type=Path, help="a plan.json (default: this install's build info)"
    )
    plan.add_argument("--json", action="store_true", help="print the JSON itself")
    args = parser.parse_args(argv)
    if args.command == "info":
        print(info_text())
        return 0
    data = json.loads(args.path.read_text()) if args.path else aphrodite_ext.build_info()
    if not data:
        print("no build plan: pass the path of a plan.json", file=sys.stderr)
        return 1
    print(json.dumps(data, indent=2) if args.json else plan_table(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
