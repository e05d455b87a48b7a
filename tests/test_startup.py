"""What a rank imports at start: every torchrun process pays for it, so heavy libraries wait for first use."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # each test starts an interpreter

HEAVY = ("torchvision", "transformers", "torch._dynamo", "torch.distributed.fsdp", "torch.distributed.tensor",
         "torch.distributed.pipelining", "plotly", "ipywidgets", "sklearn", "scipy", "pandas")


def _imported_after(code: str) -> list[str]:
    probe = f"import sys, json\n{code}\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_a_rank_of_a_pipeline_plan_on_a_zoo_mlp_imports_no_heavy_library():
    code = ("import workbench.runtime.entry as entry\n"
            "from workbench.core.plan import ParallelPlan\n"
            "from workbench.models import build_model\n"
            "for name in ('pp2-1f1b-m4', 'dp2', 'gropipe-2x2-1f1b-m4-d1', 'async-1x2-m4', 'pp2-zbh1-m4'):\n"
            "    entry.strategy_class(ParallelPlan.parse(name))\n"
            "build_model('mlp'); build_model('vgg-tiny')\n"
            "from workbench.models.data import digits_dataset\n"
            "digits_dataset()  # the digits task: scikit-learn's data file, not scikit-learn")
    assert _imported_after(code) == []


def test_the_zoo_imports_torchvision_for_a_torchvision_model_only():
    assert "torchvision" in _imported_after("from workbench.models import build_model\nbuild_model('resnet18')")
