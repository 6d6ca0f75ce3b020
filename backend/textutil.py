"""Small text helpers for turning raw log lines into display lines."""

from __future__ import annotations

import re

# CSI sequences (colours, cursor moves) and OSC sequences (titles, hyperlinks).
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text) if "\x1b" in text else text


def display_lines(lines: list[str]) -> list[str]:
    """What a terminal log view may show: no escape sequences, no carriage-return overdraws."""
    out = []
    for line in lines:
        line = strip_ansi(line)
        if "\r" in line:
            line = line.rsplit("\r", 1)[-1]
        out.append(line.replace("\t", "    "))
    return out
