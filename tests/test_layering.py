"""dapo_core stays pure: importing it loads no orchestration, tracking or serving library."""

import subprocess
import sys

FORBIDDEN = ["prefect", "mlflow", "dvc", "vllm", "deepspeed", "transformers", "pandas", "yaml"]


def test_dapo_core_imports_no_orchestration():
    code = (
        "import sys, importlib, pkgutil, dapo_core\n"
        "for m in pkgutil.iter_modules(dapo_core.__path__):\n"
        "    importlib.import_module('dapo_core.' + m.name)\n"
        f"bad = [m for m in {FORBIDDEN!r} if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"dapo_core pulled in: {out.stdout.strip()}"
