"""Command-line interface: `lmpo pipeline | train | report | presets`."""
