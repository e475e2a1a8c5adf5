"""The self-contained HTML report: inline CSS and SVG, no scripts from anywhere, no network."""
