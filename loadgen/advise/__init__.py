"""What-if: a run's costs fitted, its plan replayed through the simulator under other server settings."""
