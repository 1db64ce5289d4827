"""`capsules plan`: a launch plan explained (grid, occupancy, bytes and flops, the limiter)."""
