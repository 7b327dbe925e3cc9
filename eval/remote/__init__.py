"""Remote policies: evaluate a model behind a server (openpi, vla-eval or openvla-http protocol), and serve this
project's models over the first two (``python -m eval.serve``).

- :mod:`eval.remote.wire`: the three protocols' codecs and messages;
- :mod:`eval.remote.profiles`: the table of profiles (observation -> model inputs, model output -> action), each
  convention with the upstream file and commit it was read from;
- :mod:`eval.remote.client`: :class:`~eval.remote.client.RemotePolicy`, the ``--model remote`` policy;
- :mod:`eval.serve`: the server.
"""
