"""rtui training."""
