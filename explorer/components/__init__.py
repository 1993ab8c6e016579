"""Draw-only helpers: they take plain arrays and lists and put them on the page."""
