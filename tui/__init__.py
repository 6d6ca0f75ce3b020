"""rtui tui."""
