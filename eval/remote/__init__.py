"""Remote policies: evaluate a model behind a server (openpi or vla-eval protocol), and serve this project's
models the same way (``python -m eval.serve``).

- :mod:`eval.remote.wire`: the two protocols' codecs and messages;
- :mod:`eval.remote.profiles`: the table of profiles (observation -> model inputs, model output -> action);
- :mod:`eval.remote.client`: :class:`~eval.remote.client.RemotePolicy`, the ``--model remote`` policy;
- :mod:`eval.serve`: the server.
"""
