"""The panel at ``/panel``: static pages over the native API."""
