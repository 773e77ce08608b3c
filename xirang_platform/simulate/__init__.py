"""The trace simulator: replays real traces through the same `cycle`, on simulated time."""
