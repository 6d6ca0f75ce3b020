"""Edit one named entry of a kubeconfig in place, every other byte of the file as it was.

A kubeconfig is the user's file: comments, their quoting, their order. ``kubectl config`` and
``eksctl`` rewrite the whole file from what they parsed (and lose the comments); rtui only cuts its
own entries out and splices them in, at the text positions the YAML parser reports for each node.
Where the file has a shape this does not handle (a JSON or flow-style kubeconfig, an entry whose
``-`` stands on a line of its own), ``None`` is returned and the caller rewrites the whole file.
"""

from __future__ import annotations

from typing import Any

import yaml

Obj = dict[str, Any]


def splice_entry(text: str, section: str, name: str, item: Obj | None) -> str | None:
    """``text`` with the ``section`` entry called ``name`` replaced by ``item`` (appended when absent),
    or removed when ``item`` is None. None when the file's shape is not one handled here."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return None
    if root is None:
        return None if item is None else text + _block(section, [item])
    if not isinstance(root, yaml.MappingNode) or root.flow_style:
        return None
    found = next(((k, v) for k, v in root.value if isinstance(k, yaml.ScalarNode) and k.value == section), None)
    if found is None:
        if item is None:
            return text
        return text + ("" if text.endswith("\n") or not text else "\n") + _block(section, [item])
    key, value = found
    if isinstance(value, yaml.ScalarNode) and value.tag.endswith(":null"):
        if item is None:
            return text
        return text[:key.end_mark.index] + ":\n" + _items([item], "").rstrip("\n") + text[value.end_mark.index:]
    if not isinstance(value, yaml.SequenceNode):
        return None
    if value.flow_style:
        if value.value:
            return None
        if item is None:
            return text
        return text[:key.end_mark.index] + ":\n" + _items([item], "").rstrip("\n") + text[value.end_mark.index:]
    spans = []
    for node in value.value:
        start = text.rfind("\n", 0, node.start_mark.index) + 1
        prefix = text[start:node.start_mark.index]
        if prefix.strip() != "-":
            return None
        spans.append((node, start, _line_end(text, _last_index(node)), prefix[:prefix.index("-")]))
    ours = [s for s in spans if _name_of(s[0]) == name]
    if not ours:
        if item is None:
            return text
        indent = spans[-1][3]
        at = spans[-1][2]
        return text[:at] + ("" if text[:at].endswith("\n") else "\n") + _items([item], indent) + text[at:]
    node, start, end, indent = ours[0]
    if item is not None:
        new = _items([item], indent)
        return text[:start] + new + text[end:]
    if len(spans) == 1:  # the last one out: an empty list, as kubectl writes it
        return text[:key.end_mark.index] + ": []\n" + text[end:]
    return text[:start] + text[end:]


def set_scalar(text: str, key_name: str, value: str) -> str | None:
    """``text`` with the top-level ``key_name: value`` set (added at the end when absent)."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return None
    rendered = yaml.safe_dump(value, default_style=None).removesuffix("\n...\n").strip() if value else '""'
    if root is None:
        return text + f"{key_name}: {rendered}\n"
    if not isinstance(root, yaml.MappingNode) or root.flow_style:
        return None
    found = next(((k, v) for k, v in root.value if isinstance(k, yaml.ScalarNode) and k.value == key_name), None)
    if found is None:
        return text + ("" if text.endswith("\n") or not text else "\n") + f"{key_name}: {rendered}\n"
    key, node = found
    if not isinstance(node, yaml.ScalarNode):
        return None
    if node.start_mark.index == node.end_mark.index:  # `key:` with nothing after it
        return text[:key.end_mark.index] + f": {rendered}" + text[node.end_mark.index:]
    return text[:node.start_mark.index] + rendered + text[node.end_mark.index:]


def _block(section: str, items: list[Obj]) -> str:
    return f"{section}:\n" + _items(items, "")


def _items(items: list[Obj], indent: str) -> str:
    dumped = yaml.safe_dump(items, default_flow_style=False, sort_keys=False, width=1 << 30)
    return "".join(indent + line for line in dumped.splitlines(keepends=True))


def _name_of(node: yaml.Node) -> str | None:
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value == "name" and isinstance(v, yaml.ScalarNode):
                return str(v.value)
    return None


def _last_index(node: yaml.Node) -> int:
    """Where the node's last scalar ends (a block collection's own end mark lies past trailing comments)."""
    if isinstance(node, yaml.MappingNode) and node.value:
        return _last_index(node.value[-1][1])
    if isinstance(node, yaml.SequenceNode) and node.value:
        return _last_index(node.value[-1])
    return int(node.end_mark.index)


def _line_end(text: str, index: int) -> int:
    """The start of the line after the one ``index`` ends on."""
    if index > 0 and text[index - 1] == "\n":
        return index
    newline = text.find("\n", index)
    return len(text) if newline < 0 else newline + 1
