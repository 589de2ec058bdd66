"""specverify.platform: native detection, SPECVERIFY_PLATFORM, and each profile's policies.

The machine is faked with monkeypatch (torch.cuda.is_available, torch.version.hip), so every
test asserts the same thing on a CPU box, a CUDA box and a ROCm box.
"""

from __future__ import annotations

import pytest
import torch

from specverify import platform as P


@pytest.fixture
def machine(monkeypatch):
    """machine("cpu" | "cuda" | "rocm"): make this process see that machine."""
    def fake(kind: str) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: kind != "cpu")
        monkeypatch.setattr(torch.version, "hip", "6.2.0" if kind == "rocm" else None)
        monkeypatch.delenv(P.ENV_VAR, raising=False)
    return fake


def test_native_detection_of_this_machine(monkeypatch):
    """Unfaked: the detection names this machine, CPU box or GPU runner alike. The expectation is
    read from facts torch reports independently of native_platform's own test: the device count
    and the HIP build string."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    expected = "cpu" if gpus == 0 else ("rocm" if torch.version.hip else "cuda")
    assert P.native_platform() == expected
    monkeypatch.delenv(P.ENV_VAR, raising=False)
    profile = P.get_profile()
    assert profile.name == expected and profile.native
    assert profile.device == ("cpu" if expected == "cpu" else "cuda")
    assert set(P.available_profiles()) == {"cpu", "cuda-emulated", "rocm-emulated"} | (
        set() if expected == "cpu" else {expected})
    # Without a GPU every profile runs Triton under the interpreter; with one the native runs it compiled.
    if expected == "cpu":
        assert all(p.triton_interpreted for p in P.available_profiles().values())
    else:
        assert not P.get_profile(expected).triton_interpreted and P.get_profile(expected).cuda_graphs


# Parameter ids spell "machine=cuda", not bare "cuda": a bare id equal to a platform marker's name
# would read as that marker to a keyword-based skip.
@pytest.mark.parametrize("kind", ["cpu", "cuda", "rocm"], ids=lambda k: f"machine={k}")
def test_native_detection(machine, kind):
    machine(kind)
    assert P.native_platform() == kind
    profile = P.get_profile()
    assert profile.name == kind and profile.native


def test_env_var_picks_the_profile(machine, monkeypatch):
    machine("cpu")
    for name in ("rocm-emulated", "cuda-emulated", "cpu"):
        monkeypatch.setenv(P.ENV_VAR, name)
        assert P.get_profile().name == name
        assert P.resolve(None).name == name
    monkeypatch.setenv(P.ENV_VAR, "rocm-emulated")
    assert P.get_profile("cuda-emulated").name == "cuda-emulated", "an explicit name wins"
    monkeypatch.setenv(P.ENV_VAR, "")
    assert P.get_profile().name == "cpu", "an empty variable means native"


@pytest.mark.parametrize("name", ["gpu", "CUDA", "rocm_emulated", "tpu"], ids=lambda n: f"name={n}")
def test_unknown_profile(machine, monkeypatch, name):
    machine("cpu")
    with pytest.raises(ValueError, match="unknown") as e:
        P.get_profile(name)
    assert repr(name) in str(e.value) and "rocm-emulated" in str(e.value)
    monkeypatch.setenv(P.ENV_VAR, name)
    with pytest.raises(ValueError, match="unknown"):
        P.get_profile()


@pytest.mark.parametrize("native,missing", [("cpu", "cuda"), ("cpu", "rocm"),
                                            ("cuda", "rocm"), ("rocm", "cuda")])
def test_gpu_profile_without_its_device(machine, monkeypatch, native, missing):
    machine(native)
    with pytest.raises(RuntimeError, match=f"{missing}-emulated") as e:
        P.get_profile(missing)
    assert repr(native) in str(e.value)
    monkeypatch.setenv(P.ENV_VAR, missing)
    with pytest.raises(RuntimeError, match=missing):
        P.get_profile()


def test_available_profiles_per_machine(machine):
    emulated = {"cpu", "cuda-emulated", "rocm-emulated"}
    for native, extra in (("cpu", set()), ("cuda", {"cuda"}), ("rocm", {"rocm"})):
        machine(native)
        assert set(P.available_profiles()) == emulated | extra
        assert set(P.available_profiles()) <= set(P.ALL_PROFILE_NAMES)


def test_rocm_emulated_policies(machine):
    machine("cpu")
    p = P.get_profile("rocm-emulated")
    assert (p.policy, p.device, p.native) == ("rocm", "cpu", False)
    assert p.fp8_formats == ("float8_e4m3fnuz", "float8_e5m2fnuz")
    assert p.argmax_fast_path is False and p.cuda_graphs is False
    assert p.supports_fp8("float8_e4m3fnuz") and not p.supports_fp8("float8_e4m3fn")
    assert str(p) == "rocm-emulated"


def test_cuda_emulated_policies(machine):
    machine("cpu")
    p = P.get_profile("cuda-emulated")
    assert (p.policy, p.device, p.native) == ("cuda", "cpu", False)
    assert p.fp8_formats == ("float8_e4m3fn", "float8_e5m2")
    assert p.argmax_fast_path is True and p.cuda_graphs is False
    assert p.supports_fp8("float8_e5m2") and not p.supports_fp8("float8_e5m2fnuz")


def test_cpu_profile_policies(machine):
    machine("cpu")
    p = P.get_profile("cpu")
    assert (p.policy, p.device, p.native) == ("cpu", "cpu", True)
    assert set(p.fp8_formats) == {"float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"}
    assert p.argmax_fast_path is True and p.cuda_graphs is False
    assert all(q.triton_interpreted for q in P.available_profiles().values()), \
        "without a GPU every profile runs Triton under the interpreter"


@pytest.mark.parametrize("native", ["cuda", "rocm"], ids=lambda k: f"machine={k}")
def test_native_gpu_profiles(machine, native):
    machine(native)
    p = P.get_profile(native)
    assert (p.policy, p.device, p.native) == (native, "cuda", True)
    assert p.cuda_graphs and not p.triton_interpreted
    assert p.argmax_fast_path is (native == "cuda")
    assert p.fp8_formats == (P.CUDA_FP8 if native == "cuda" else P.ROCM_FP8)
    assert P.get_profile("cpu").native is False
    for name in ("cuda-emulated", "rocm-emulated"):
        emulated = P.get_profile(name)
        assert emulated.device == "cpu"
        assert emulated.triton_interpreted, "CPU tensors can only run Triton under the interpreter"


def test_emulated_profiles_share_policies_with_native(machine):
    """An emulated profile differs from the native one only in device, native and runtime flags."""
    for native in ("cuda", "rocm"):
        machine(native)
        real, emu = P.get_profile(native), P.get_profile(f"{native}-emulated")
        assert (real.policy, real.fp8_formats, real.argmax_fast_path) == \
            (emu.policy, emu.fp8_formats, emu.argmax_fast_path)


def test_resolve(machine):
    machine("cpu")
    p = P.get_profile("rocm-emulated")
    assert P.resolve(p) is p
    assert P.resolve("cuda-emulated").name == "cuda-emulated"
    assert P.resolve(None).name == "cpu"
    with pytest.raises(ValueError):
        P.resolve("nope")


def test_profiles_are_frozen(machine):
    machine("cpu")
    p = P.get_profile("cpu")
    with pytest.raises(AttributeError):
        p.argmax_fast_path = False  # type: ignore[misc]


@pytest.mark.parametrize("cuda, hip, reason", [
    (None, None, "is a CPU-only build"),
    ("13.0", None, "torch.cuda.is_available() is False: no GPU is visible (driver, CUDA_VISIBLE_DEVICES)"),
    (None, "6.4", "torch.cuda.is_available() is False: no GPU is visible (driver, CUDA_VISIBLE_DEVICES)"),
])
def test_the_absence_of_a_gpu_names_its_cause(monkeypatch, cuda, hip, reason):
    """A CPU-only build and a GPU build without a visible GPU are told apart (found by the first
    generated-mutant campaign: nothing pinned either message)."""
    import specverify.platform as platform_mod

    monkeypatch.setattr(platform_mod, "native_platform", lambda: "cpu")
    monkeypatch.setattr(platform_mod.torch.version, "cuda", cuda)
    monkeypatch.setattr(platform_mod.torch.version, "hip", hip)
    got = platform_mod._gpu_absence("cuda")
    assert got.endswith(reason), got


def test_nothing_is_capturing_outside_a_graph_capture():
    assert P.capturing() is False and P.capturing("cpu") is False and P.capturing(torch.device("cpu")) is False


@pytest.mark.cuda
def test_capturing_is_true_only_inside_a_capture_and_only_for_cuda():
    """Inside a CUDA-graph capture the value checks of the ops must not read the device; outside
    one they must (found by the first generated-mutant campaign: no test captured a check)."""
    assert P.capturing() is False and P.capturing("cuda") is False and P.capturing("cpu") is False
    x = torch.ones(4, device="cuda")
    stream, graph, seen = torch.cuda.Stream(), torch.cuda.CUDAGraph(), {}
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        y = x * 2                                     # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph, stream=stream):
        seen = {"none": P.capturing(), "cuda": P.capturing("cuda"), "cpu": P.capturing("cpu")}
        y = x * 2
    graph.replay()
    torch.cuda.synchronize()
    assert seen == {"none": True, "cuda": True, "cpu": False} and y.tolist() == [2.0] * 4
    assert P.capturing("cuda") is False


@pytest.mark.cuda
def test_an_emulated_profile_places_the_models_on_its_device():
    """On a GPU box, build_models(platform="cpu") (or an emulated profile) without a device puts
    the models on the profile's device, the CPU, not the native GPU."""
    import specverify

    for name in ("cpu", "rocm-emulated"):
        models = specverify.build_models("tiny", platform=name, logits_dtype="float32")
        assert models.device.type == "cpu", name


@pytest.mark.cuda
def test_draft_selection_checks_its_scale_device_and_stays_capturable():
    """A scale on another device than the logits is refused by name; with a scale on the same
    device, select_draft_topk is captured in a CUDA graph without reading the device back (its
    value check is skipped inside the capture) and replays what the eager call computes."""
    from specverify import ops

    logits = torch.randn((3, 50), device="cuda")
    with pytest.raises(ValueError, match=r"scale is on cpu, logits on cuda:0"):
        ops.select_draft_topk(logits, 2, scale=torch.ones((3, 1)))
    scale = torch.full((3, 1), 0.5, device="cuda")
    want = ops.select_draft_topk(logits, 2, scale=scale)
    stream, graph = torch.cuda.Stream(), torch.cuda.CUDAGraph()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ops.select_draft_topk(logits, 2, scale=scale)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph, stream=stream):
        got = ops.select_draft_topk(logits, 2, scale=scale)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])
