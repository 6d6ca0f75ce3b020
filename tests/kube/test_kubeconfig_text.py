"""rtui's kubeconfig entries go in and out of a user's file leaving every other byte where it was."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from targets.aws import eks

ARN = "arn:aws:eks:us-west-2:111122223333:cluster/rtui-demo"
KUBECTL_STYLE = """\
apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: QUJD
    server: https://a.example.com
  name: a
# the staging cluster, keep it
- cluster:
    server: https://b.example.com   # behind the VPN
  name: b
contexts:
- context:
    cluster: a
    user: a
  name: a
current-context: a
kind: Config
preferences: {}
users:
- name: a
  user:
    token: "t0k3n"
"""
SHAPES = {
    "kubectl's own": KUBECTL_STYLE,
    "indented lists and flow maps": KUBECTL_STYLE.replace("- cluster:\n    certificate", "- cluster:\n    certificate")
    .replace("contexts:\n- context:\n    cluster: a\n    user: a\n  name: a\n",
             "contexts:\n  - context: {cluster: a, user: a}\n    name: a\n"),
    "empty lists": "apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\ncurrent-context: \"\"\n",
    "no sections": "# nothing yet\napiVersion: v1\nkind: Config\n",
}


def write(path: Path) -> str:
    return eks.write_kubeconfig_entry(path, cluster_name="rtui-demo", region="us-west-2",
                                      endpoint="https://EX.gr7.us-west-2.eks.amazonaws.com", ca_data_b64="Q0E=",
                                      arn=ARN, rtui_bin="/usr/bin/rtui")


@pytest.mark.parametrize("shape", list(SHAPES))
def test_an_entry_written_then_removed_leaves_the_others_as_they_were(shape: str, tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text(SHAPES[shape])
    before = yaml.safe_load(SHAPES[shape])
    write(path)
    written = path.read_text()
    doc = yaml.safe_load(written)
    for section in ("clusters", "users", "contexts"):
        names = [e["name"] for e in doc[section]]
        assert names == [e["name"] for e in before.get(section) or []] + [ARN], (section, written)
    assert next(c for c in doc["clusters"] if c["name"] == ARN)["cluster"]["server"].startswith("https://EX.")
    assert doc["current-context"] == (before.get("current-context") or ARN)
    assert "# " not in SHAPES[shape] or all(line in written for line in SHAPES[shape].splitlines() if "#" in line)
    write(path)  # a re-run changes nothing
    assert path.read_text() == written
    assert eks.remove_kubeconfig_entry(path, ARN)
    after = path.read_text()
    if shape in ("kubectl's own", "indented lists and flow maps", "empty lists"):
        assert after == SHAPES[shape]
    else:  # the lists rtui added stay, empty
        assert after.startswith(SHAPES[shape]) and yaml.safe_load(after)["clusters"] == []
    assert not eks.remove_kubeconfig_entry(path, ARN)


def test_a_stale_entry_of_the_same_name_is_replaced_in_place(tmp_path: Path) -> None:
    path = tmp_path / "config"
    stale = KUBECTL_STYLE.replace("contexts:\n", f"- cluster:\n    server: https://old.example.com\n  name: {ARN}\n"
                                               "contexts:\n", 1)
    path.write_text(stale)
    write(path)
    text = path.read_text()
    assert "old.example.com" not in text and text.count(ARN) >= 3
    assert text.startswith(KUBECTL_STYLE.split("- cluster:\n    server: https://b")[0])
