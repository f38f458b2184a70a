"""Builds a wheel of the installed backend (reusing its build directory), checks that it is an
abi3 wheel carrying exactly the modules that were built, installs it into an empty directory and
runs one op from there, away from the source tree.

    python tools/check_wheel.py            (APHRODITE_TARGET_DEVICE as for the install)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SMOKE = """
import json, sys, torch, aphrodite_ext
assert aphrodite_ext.__file__.startswith(sys.argv[1]), aphrodite_ext.__file__
aphrodite_ext.load("_C")
x = torch.randn(3, 2 * 77)
out = torch.empty(3, 77)
if aphrodite_ext.build_info()["backend"] == "cpu":
    torch.ops._C.silu_and_mul(out, x)
    ref = torch.nn.functional.silu(x[:, :77]) * x[:, 77:]
    torch.testing.assert_close(out, ref)
print(json.dumps(sorted(m for m, s in aphrodite_ext.build_info()["modules"].items() if s["built"])))
"""


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                ".",
                "--no-build-isolation",
                "--no-deps",
                "-q",
                "-w",
                str(tmp / "dist"),
            ],
            cwd=ROOT,
            check=True,
        )
        (wheel,) = (tmp / "dist").glob("*.whl")
        assert "-abi3-" in wheel.name, f"not an abi3 wheel: {wheel.name}"
        names = zipfile.ZipFile(wheel).namelist()
        info = json.loads(zipfile.ZipFile(wheel).read("aphrodite_ext/_build_info.json"))
        built = sorted(m for m, s in info["modules"].items() if s["built"])
        shipped = sorted(
            Path(n).name.split(".")[0] for n in names if n.endswith(".so") or n.endswith(".pyd")
        )
        assert shipped == built, f"wheel ships {shipped}, the build made {built}"
        for name in shipped:
            assert f"aphrodite_ext/{name}.abi3.so" in names, f"{name} is not named .abi3.so"

        site = tmp / "site"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--no-deps",
                "-q",
                "--target",
                str(site),
                str(wheel),
            ],
            check=True,
        )
        env = {**os.environ, "PYTHONPATH": str(site)}
        out = subprocess.run(
            [sys.executable, "-c", SMOKE, str(site)],
            cwd=tmp,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        print(
            f"{wheel.name}: abi3, modules {shipped}; installed copy imports and runs ({out.strip()})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
