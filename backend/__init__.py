"""rtui backend."""
