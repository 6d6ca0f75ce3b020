"""The image digest asked of a registry at plan time, over real HTTP on loopback."""

from __future__ import annotations

import socket

from targets.kube.registry import parse, resolve_digest
from tests.kube.fake_registry import FakeRegistry


def test_an_anonymous_token_challenge_is_answered_and_the_digest_pins_the_image() -> None:
    with FakeRegistry() as registry:
        resolved = resolve_digest(registry.image())
    assert resolved.digest == registry.tags["rtui/ray:test"]
    assert resolved.reason.startswith("pinned")
    methods = [(m, auth) for m, _, auth in registry.requests]
    assert methods[0] == ("HEAD", None) and methods[-1] == ("HEAD", "Bearer anonymous-pull-token")


def test_an_unknown_tag_or_a_dead_registry_leaves_the_tag_unpinned_quickly() -> None:
    with FakeRegistry(token=False) as registry:
        missing = resolve_digest(registry.image("rtui/ray:nope"))
    assert missing.digest is None and "unpinned" in missing.reason
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = resolve_digest(f"127.0.0.1:{port}/rtui/ray:test", timeout_s=1.0)
    # Quickly: the refusal itself ends it, as the reason says (not a timeout; no stopwatch asserted).
    assert dead.digest is None and "did not answer" in dead.reason and "refused" in dead.reason, dead.reason


def test_a_listener_that_never_answers_is_cut_at_the_deadline() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        resolved = resolve_digest(f"127.0.0.1:{s.getsockname()[1]}/rtui/ray:test", timeout_s=0.5)
    # Cut by the read deadline, as the reason says (no elapsed-time figure asserted).
    assert resolved.digest is None and "timed out" in resolved.reason, resolved.reason


def test_image_names_are_read_as_docker_reads_them() -> None:
    ref = parse("public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1")
    assert (ref.registry, ref.repository, ref.reference, ref.scheme) == (
        "public.ecr.aws", "deep-learning-containers/ray", "train-ml-cuda-v1.1", "https")
    assert parse("ubuntu").repository == "library/ubuntu" and parse("ubuntu").reference == "latest"
    assert parse("localhost:5000/a/b").scheme == "http"
    pinned = "sha256:" + "a" * 64
    assert resolve_digest(f"quay.io/x/y:t@{pinned}").digest == pinned  # no request: pinned by the user


def test_the_image_size_is_its_linux_amd64_layers_as_downloaded() -> None:
    from targets.kube.registry import image_size

    with FakeRegistry(layers={"rtui/ray:test": [7_000_000_000, 3_000_000_000]}) as registry:
        sized = image_size(registry.image())
        missing = image_size(registry.image("rtui/ray:nope"))
    assert sized.compressed_bytes == 10_000_000_000  # the amd64 entry of the index, not the arm64 one
    assert "2 layers" in sized.reason
    auths = [auth for method, path, auth in registry.requests if method == "GET" and "/manifests/" in path]
    assert auths[0] is None and auths[-1] == "Bearer anonymous-pull-token"
    assert missing.compressed_bytes is None and "HTTP 404" in missing.reason


def test_each_repository_is_opened_by_a_token_of_its_own_scope() -> None:
    from tests.kube.fake_registry import token_for

    with FakeRegistry() as registry:
        operator = resolve_digest(registry.image("kuberay/operator:v1.7.0"))
        plugin = resolve_digest(registry.image("nvidia/k8s-device-plugin:v0.18.0"))
    assert operator.digest == registry.tags["kuberay/operator:v1.7.0"]
    assert plugin.digest == registry.tags["nvidia/k8s-device-plugin:v0.18.0"]
    tokens = {path: auth for method, path, auth in registry.requests if method == "HEAD" and auth}
    assert tokens == {"/v2/kuberay/operator/manifests/v1.7.0": f"Bearer {token_for('kuberay/operator')}",
                      "/v2/nvidia/k8s-device-plugin/manifests/v0.18.0":
                          f"Bearer {token_for('nvidia/k8s-device-plugin')}"}
