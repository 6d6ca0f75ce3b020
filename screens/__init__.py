"""rtui screens."""
