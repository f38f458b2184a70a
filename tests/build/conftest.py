"""Build-system tests load aphrodite_ext/build_options.py from its file, as setup.py does, so
that they never depend on (or check) an installed build."""

import importlib.util
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parents[2] / "aphrodite_ext" / "build_options.py"
_spec = importlib.util.spec_from_file_location("aphrodite_build_options", _PATH)
build_options = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = build_options
_spec.loader.exec_module(build_options)
