"""vecmerge demo: the user's v58 story end to end on toy trajectories it trains itself."""
