"""The streaming engine: per-host state, rules as data (rules/*.yaml), episodes: the hot path."""
