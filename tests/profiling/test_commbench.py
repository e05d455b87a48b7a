"""Link calibration: the alpha-beta fit, and a real 2-rank gloo run under torchrun."""

import json

import pytest

from workbench.cli import main
from workbench.core.costs import LinkSpec
from workbench.runtime.commbench import fit_link, load_link

SIZES = [1024, 16384, 262144, 4194304]


def test_fit_recovers_point_to_point_link():
    truth = LinkSpec("truth", latency_us=70.0, bandwidth_gbs=4.4)
    fitted = fit_link(SIZES, [truth.transfer_ms(n) for n in SIZES], "fit")
    assert fitted.latency_us == pytest.approx(70.0, rel=1e-3)
    assert fitted.bandwidth_gbs == pytest.approx(4.4, rel=1e-3)


def test_fit_recovers_ring_allreduce_link():
    truth = LinkSpec("truth", latency_us=20.0, bandwidth_gbs=1.2)
    fitted = fit_link(SIZES, [truth.allreduce_ms(n, 4) for n in SIZES], "fit", group_size=4)
    assert fitted.latency_us == pytest.approx(20.0, rel=1e-3)
    assert fitted.bandwidth_gbs == pytest.approx(1.2, rel=1e-3)


def test_fit_rejects_unfittable_data():
    with pytest.raises(ValueError, match="at least 2"):
        fit_link([1024], [0.1], "x")
    with pytest.raises(ValueError, match="do not grow with message size"):
        fit_link([1024, 4096], [2.0, 1.0], "x")
    with pytest.raises(ValueError, match="group_size must be >= 2"):
        fit_link([1024, 4096], [1.0, 2.0], "x", group_size=1)


@pytest.mark.multiproc
def test_commbench_two_gloo_ranks_under_torchrun(tmp_path, capsys):
    out = tmp_path / "link.json"
    # sizes up to 16 MiB so the bandwidth term (~4 ms) stands above scheduling noise on a busy machine
    sizes = [1024, 65536, 4194304, 16777216]
    code = main(["commbench", "--nproc", "2", "--out", str(out), "--iters", "8",
                 "--sizes", ",".join(map(str, sizes))])
    printed = capsys.readouterr().out
    assert code == 0, printed
    data = json.loads(out.read_text())
    assert data["world_size"] == 2 and data["backend"] == "gloo"
    assert [m["bytes"] for m in data["measurements"]["p2p"]] == sizes
    assert all(m["min_ms"] > 0 and m["ms"] >= m["min_ms"] for m in data["measurements"]["allreduce"])
    link = load_link(out)
    assert link.bandwidth_gbs > 0 and link.latency_us >= 0
    largest = data["measurements"]["p2p"][-1]
    assert link.transfer_ms(largest["bytes"]) == pytest.approx(largest["min_ms"], rel=0.5)
    assert "fitted p2p: latency" in printed
