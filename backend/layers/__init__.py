"""Layers of resources (DESIGN.md §2): each owns a few kinds, with one handler per kind."""
