"""One file per page; each runs top to bottom when its page is shown."""
