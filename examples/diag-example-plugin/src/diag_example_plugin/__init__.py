"""An example diag check plugin: see docs/plugins.md."""
