"""``fadat serve``: a JSON translation server with a web page that draws the graph.

- :mod:`fadat.serve.engine` — the model behind the server: request options checked, sentences
  translated and scored (``confidence``), the graph of one sentence as JSON numbers;
- :mod:`fadat.serve.batching` — dynamic batching of concurrent requests;
- :mod:`fadat.serve.app` — the ASGI application (FastAPI): endpoints, limits, JSON errors;
- :mod:`fadat.serve.protocol` — the HTTP connections: header timeout, header size, connection cap;
- :mod:`fadat.serve.server` — :func:`serve` (uvicorn), which ``fadat serve``
  (:mod:`fadat.cli.serve`) runs;
- ``static/`` — the web page (HTML, CSS, JavaScript; no external asset).

FastAPI and uvicorn are the optional extra ``serve`` (``pip install -e .[serve]``).
"""

from fadat.serve.server import serve

__all__ = ["serve"]
