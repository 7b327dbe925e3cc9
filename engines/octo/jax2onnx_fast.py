"""jax2onnx's output check without its quadratic scan: the same answers, in O(1) for the common case.

jax2onnx 0.17.1 checks, after lowering each JAX equation, that the equation's outputs are connected to the
graph (``converter/output_binding.py: _value_is_graph_connected``), by comparing each output with every graph
input, every initializer and every output of every node built so far. Octo's backbone has about 5,600
equations, so the export spent most of its time there: 65% of octo-small's 88 s export
(``python -m benchmarks.engines_build``; cProfile: 50 M value comparisons).

:func:`fast_output_check` answers True at once when the value's producer node is a node of the builder's
graph (onnx_ir sets ``Node.graph`` when a node is appended and clears it when it is removed, so that node is
in the scan), or when an initializer of that graph is the value or has its name (initializers are a dict by
name); in every other case (a graph input, a name shared with another node's output, a value not connected,
a builder of another kind) it asks jax2onnx's own check. It never answers True where jax2onnx's check would
answer False, nor the reverse, so the exported graph is the same file (``tests/test_octo_export.py`` compares
the bytes of an export with and without it).
"""

from __future__ import annotations

import contextlib


def _fast_check(original):
    def connected(ctx, value) -> bool:
        import onnx_ir as ir

        graph = getattr(getattr(ctx, "builder", None), "nodes", None)
        if isinstance(graph, ir.Graph) and isinstance(value, ir.Value):
            producer = value.producer()
            if producer is not None and producer.graph is graph:
                return True
            name = value.name
            if name:
                existing = graph.initializers.get(name)
                if existing is value or (isinstance(existing, ir.Value) and existing.name == name):
                    return True
        return original(ctx, value)

    connected.original = original
    return connected


@contextlib.contextmanager
def fast_output_check():
    """While inside, jax2onnx checks lowered outputs with :func:`_fast_check` (restored on exit)."""
    from jax2onnx.converter import output_binding

    original = output_binding._value_is_graph_connected
    output_binding._value_is_graph_connected = _fast_check(original)
    try:
        yield
    finally:
        output_binding._value_is_graph_connected = original
