"""The operator's dashboard: ``index.html``, ``app.js`` and ``app.css``, served as package data at
``/``, ``/dashboard/app.js`` and ``/dashboard/app.css`` on the master's HTTP port.

The page reads and acts only through the memory API (``/v1/memory/...``); this package holds
no Python code, only the static files.
"""
