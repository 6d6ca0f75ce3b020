"""rtui screens: each renders one stage of the wizard and routes to the next."""
