import json

import pytest

from workbench.core.costs import ClusterSpec, DeviceSpec, LayerCost, LinkSpec, ModelCosts

MINIMAL = {
    "version": 2, "model": "toy", "batch_size": 8, "device": "cpu",
    "layers": [
        {"name": "a", "forward_ms": 1.0, "backward_ms": 2.0, "flops": 10, "param_bytes": 40,
         "activation_bytes": 64, "saved_bytes": 64},
        {"name": "b", "forward_ms": 0.5, "backward_ms": 1.0},
    ],
}

# A file as version 1 wrote it (before the split backward), kept literally: such files must keep loading.
VERSION_1_FILE = """{"version": 1, "model": "old", "batch_size": 4, "device": "cpu", "dtype": "float32",
 "input_bytes": 256, "meta": {"repeats": 3},
 "layers": [{"name": "fc", "forward_ms": 1.5, "backward_ms": 3.0, "flops": 1024, "param_bytes": 4096,
             "activation_bytes": 512, "saved_bytes": 256, "grad_bytes": 4096, "optimizer_bytes": 8192,
             "forward_ms_spread": 0.1, "backward_ms_spread": 0.2, "peak_bytes": 9000, "num_params": 1024},
            {"name": "relu", "forward_ms": 0.25, "backward_ms": 0.5, "activation_bytes": 512}]}"""


def test_public_json_format_reads_minimal_files(tmp_path):
    costs = ModelCosts.from_dict(MINIMAL)
    assert costs.num_layers == 2 and costs.names == ["a", "b"]
    assert costs[1].param_bytes == 0 and costs[1].grad_bytes == 0
    assert costs[0].grad_bytes == 40 and costs[0].compute_ms == 3.0
    assert costs.total("forward_ms") == 1.5
    path = costs.save(tmp_path / "c.json")
    again = ModelCosts.load(path)
    assert again == costs
    data = json.loads(path.read_text())
    for key in ("version", "model", "batch_size", "device", "layers"):
        assert key in data
    assert set(MINIMAL["layers"][0]) <= set(data["layers"][0])


def test_uniform_helper():
    c = ModelCosts.uniform(4, forward_ms=1, backward_ms=2, param_bytes=8)
    assert c.num_layers == 4 and c.total("compute_ms") == 12
    assert c[0].input_grad_ms is None and c[0].split_backward_ms == (1.0, 1.0)  # fallback: half and half


def test_uniform_split_backward_builds_f_equal_i_equal_w():
    c = ModelCosts.uniform(3, forward_ms=1, backward_ms=2, input_grad_ms=1, weight_grad_ms=1)
    assert all(l.has_split_backward and (l.forward_ms, *l.split_backward_ms) == (1, 1, 1) for l in c.layers)
    assert c.total("input_grad_ms") == c.total("weight_grad_ms") == 3
    with pytest.raises(ValueError, match=r"LayerCost\[layer0\].weight_grad_ms is missing"):
        ModelCosts.uniform(2, input_grad_ms=1.0)


def test_version_2_file_round_trip_keeps_the_split(tmp_path):
    data = json.loads(json.dumps(MINIMAL))
    data["layers"][0].update(input_grad_ms=0.75, weight_grad_ms=1.5, input_grad_ms_spread=0.05, weight_grad_ms_spread=0.1)
    costs = ModelCosts.from_dict(data)
    assert costs[0].split_backward_ms == (0.75, 1.5)  # measured: returned as is, not forced to sum to backward_ms
    assert costs[0].backward_ms == 2.0 and costs[0].input_grad_ms_spread == 0.05
    again = ModelCosts.load(costs.save(tmp_path / "c.json"))
    assert again == costs and again.version == 3 and again.batch_fit is None  # written as version 3, no fit
    written = json.loads((tmp_path / "c.json").read_text())
    assert written["version"] == 3 and "batch_fit" not in written
    assert {k: written["layers"][0][k] for k in ("input_grad_ms", "weight_grad_ms", "input_grad_ms_spread",
                                                 "weight_grad_ms_spread")} == {
        "input_grad_ms": 0.75, "weight_grad_ms": 1.5, "input_grad_ms_spread": 0.05, "weight_grad_ms_spread": 0.1}
    assert not any("grad_ms" in k for k in written["layers"][1])  # an unmeasured split writes no split fields


def test_version_1_file_loads_unchanged_with_the_fallback_split(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(VERSION_1_FILE)
    costs = ModelCosts.load(path)
    fc, relu = costs.layers
    assert costs.names == ["fc", "relu"] and costs.batch_size == 4 and costs.input_bytes == 256
    assert costs.meta == {"repeats": 3}
    assert (fc.forward_ms, fc.backward_ms, fc.flops, fc.param_bytes, fc.optimizer_bytes) == (1.5, 3.0, 1024, 4096, 8192)
    assert (fc.forward_ms_spread, fc.backward_ms_spread, fc.peak_bytes, fc.num_params) == (0.1, 0.2, 9000, 1024)
    assert fc.input_grad_ms is None and fc.weight_grad_ms is None and not fc.has_split_backward
    assert fc.split_backward_ms == (1.5, 1.5)  # trainable parameters: backward_ms in half
    assert relu.grad_bytes == 0 and relu.split_backward_ms == (0.5, 0.0)  # no parameters: all input gradient
    # upgraded in memory and written as version 3, with nothing added to the layers and no batch fit
    assert costs.version == 3 and costs.batch_fit is None
    written = json.loads(costs.save(tmp_path / "new.json").read_text())
    assert written["version"] == 3 and "batch_fit" not in written
    old = json.loads(VERSION_1_FILE)
    for before, after in zip(old["layers"], written["layers"]):
        assert {k: after[k] for k in before} == before and not any("grad_ms" in k for k in after)
    assert ModelCosts.load(tmp_path / "new.json") == costs


@pytest.mark.parametrize(
    "mutate, fragment",
    [(lambda d: d.update(version=4), "'version' must be 1, 2 or 3, got 4"),
     (lambda d: d.update(version=True), "'version' must be 1, 2 or 3, got True"),
     (lambda d: d.update(batch_fit={"sizes": [8], "forward_ms": [[1.0], [0.5]], "backward_ms": [[2.0], [1.0]]}),
      "version 2 ModelCosts file has the version 3 field 'batch_fit'"),
     (lambda d: d.pop("layers"), "missing required fields \\['layers'\\]"),
     (lambda d: d.update(layers=[]), "at least one layer"),
     (lambda d: d.update(batch_size=0), "batch_size must be > 0"),
     (lambda d: d["layers"][0].update(forward_ms=-1.0), r"LayerCost\[a\].forward_ms must be >= 0"),
     (lambda d: d["layers"][0].update(flops=1.5), "flops must be a finite int"),
     (lambda d: d["layers"][0].update(colour="red"), r"'LayerCost\[a\].colour' = 'red' is invalid: unknown field"),
     (lambda d: d["layers"][1].pop("backward_ms"), "missing required fields \\['backward_ms'\\]"),
     (lambda d: d["layers"][0].update(forward_ms=float("nan")), "finite number"),
     (lambda d: d["layers"][0].update(input_grad_ms=-1.0, weight_grad_ms=1.0), r"LayerCost\[a\].input_grad_ms must be >= 0"),
     (lambda d: d["layers"][0].update(input_grad_ms=1.0, weight_grad_ms="1"),
      r"LayerCost\[a\].weight_grad_ms must be a finite number, got '1'"),
     (lambda d: d["layers"][0].update(input_grad_ms=1.0), r"LayerCost\[a\].weight_grad_ms is missing.*together"),
     (lambda d: d["layers"][1].update(weight_grad_ms=0.5), r"LayerCost\[b\].input_grad_ms is missing"),
     (lambda d: d["layers"][0].update(input_grad_ms=1.0, weight_grad_ms=1.0, weight_grad_ms_spread=-0.1),
      r"LayerCost\[a\].weight_grad_ms_spread must be >= 0"),
     (lambda d: d["layers"][0].update(input_grad_ms_spread=0.1),
      r"LayerCost\[a\].input_grad_ms_spread is 0.1 but input_grad_ms was not measured"),
     (lambda d: d.update(version=1) or d["layers"][0].update(input_grad_ms=1.0, weight_grad_ms=1.0),
      r"layer 'a' of a version 1 file has the version 2 fields \['input_grad_ms', 'weight_grad_ms'\]")],
)
def test_bad_costs(mutate, fragment):
    data = json.loads(json.dumps(MINIMAL))
    mutate(data)
    with pytest.raises(ValueError, match=fragment):
        ModelCosts.from_dict(data)


def test_load_reports_path_and_bad_json(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json: ModelCosts file is not valid JSON"):
        ModelCosts.load(bad)
    with pytest.raises(ValueError, match="no ModelCosts file"):
        ModelCosts.load(tmp_path / "missing.json")


def test_link_alpha_beta():
    link = LinkSpec("pcie", latency_us=10, bandwidth_gbs=10)
    assert link.transfer_ms(0) == 0
    assert link.transfer_ms(10e6) == pytest.approx(0.01 + 1.0)
    # ring all-reduce of 8 MB over 4 ranks: 6 steps of latency + 1.5 x bytes / bandwidth
    assert link.allreduce_ms(8e6, 4) == pytest.approx(6 * 0.01 + 1.5 * 0.8)
    assert link.allreduce_ms(8e6, 1) == 0
    with pytest.raises(ValueError, match="bandwidth_gbs must be > 0"):
        LinkSpec("x", 1, 0)


def make_cluster(**kw):
    dev = DeviceSpec("V100", {"float32": 15.7, "float16": 125.0}, 32 * 2**30, 900.0, 0.5)
    defaults = dict(name="2x4", num_nodes=2, devices_per_node=4, device=dev,
                    intra_node=LinkSpec("nvlink", 5, 100), inter_node=LinkSpec("ib", 10, 12))
    defaults.update(kw)
    return ClusterSpec(**defaults)


def test_cluster_links_and_json():
    c = make_cluster()
    assert c.world_size == 8 and c.node_of(5) == 1
    assert c.link(0, 3).name == "nvlink" and c.link(3, 4).name == "ib"
    assert c.group_link([0, 1, 2]).name == "nvlink" and c.group_link([0, 4]).name == "ib"
    assert ClusterSpec.from_json(c.to_json()) == c
    assert c.device.tflops("float16") == 125.0
    with pytest.raises(ValueError, match="no peak for dtype 'int8'"):
        c.device.tflops("int8")


@pytest.mark.parametrize(
    "kw, fragment",
    [(dict(inter_node=None), "2 nodes but no inter_node link"), (dict(num_nodes=0), "num_nodes must be > 0"),
     (dict(overlap_slowdown=0.5), "overlap_slowdown must be in"), (dict(devices_per_node=2.5), "devices_per_node must be a finite int")],
)
def test_bad_cluster(kw, fragment):
    with pytest.raises(ValueError, match=fragment):
        make_cluster(**kw)


def test_bad_device():
    with pytest.raises(ValueError, match="efficiency must be in"):
        DeviceSpec("x", {"float32": 1.0}, 1, 1.0, efficiency=1.5)
    with pytest.raises(ValueError, match="peak_tflops must map"):
        DeviceSpec("x", {}, 1, 1.0)
    with pytest.raises(ValueError, match="non-empty str"):
        LayerCost("", 1, 1)
