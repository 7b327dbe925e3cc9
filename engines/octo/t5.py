"""The T5 encoder in JAX, over the weights the Octo checkpoint stores itself.

Octo keeps the (frozen) t5-base encoder inside its checkpoint at
``octo_transformer/task_tokenizers_language/hf_model``::

    shared/embedding                                   (vocab, d_model)
    encoder/block/<i>/layer/0/SelfAttention/{q,k,v,o}/kernel
    encoder/block/0/layer/0/SelfAttention/relative_attention_bias/embedding   (buckets, heads)
    encoder/block/<i>/layer/0/layer_norm/weight
    encoder/block/<i>/layer/1/DenseReluDense/{wi,wo}/kernel
    encoder/block/<i>/layer/1/layer_norm/weight
    encoder/final_layer_norm/weight

T5 specifics: RMS layer norm without bias or mean (eps 1e-6), unscaled
dot-product attention, a relative position bias computed in the first block
and shared by all blocks (bidirectional buckets), ReLU feed-forward, no dropout
at inference. Padding ids are masked as keys; every position, padding
included, has an output (Octo uses all of them).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from engines.octo.config import T5Spec

NEG = float(np.finfo(np.float32).min)


def rms_norm(weight, x, eps: float):
    var = jnp.mean(jnp.square(x.astype(jnp.float32)), axis=-1, keepdims=True)
    return weight * (x / jnp.sqrt(var + eps))


@functools.lru_cache(maxsize=8)
def relative_buckets(length: int, num_buckets: int = 32, max_distance: int = 128) -> np.ndarray:
    """(L, L) int32 bucket of (key position - query position), bidirectional, computed in float32."""
    ctx = np.arange(length, dtype=np.int32)[:, None]
    mem = np.arange(length, dtype=np.int32)[None, :]
    rel = mem - ctx
    half = num_buckets // 2
    out = (rel > 0).astype(np.int32) * half
    rel = np.abs(rel)
    max_exact = half // 2
    with np.errstate(divide="ignore"):
        large = max_exact + (np.log(rel.astype(np.float32) / np.float32(max_exact))
                             / np.float32(np.log(np.float32(max_distance / max_exact)))
                             * np.float32(half - max_exact))
    large = np.minimum(large, np.float32(half - 1))
    out = (out + np.where(rel < max_exact, rel.astype(np.float32), large)).astype(np.int32)
    out.setflags(write=False)
    return out


def t5_encode(p, spec: T5Spec, input_ids, attention_mask):
    """Last hidden state (B, L, d_model) of the T5 encoder. ``p``: the ``hf_model`` subtree."""
    x = jnp.take(p["shared"]["embedding"], input_ids, axis=0)
    b, length, _ = x.shape
    blocks = p["encoder"]["block"]
    table = blocks["0"]["layer"]["0"]["SelfAttention"]["relative_attention_bias"]["embedding"]
    bias = jnp.take(table, jnp.asarray(relative_buckets(length, spec.num_buckets, spec.max_distance)), axis=0)
    bias = jnp.transpose(bias, (2, 0, 1))[None]  # (1, H, L, L)
    pad = jnp.where(attention_mask[:, None, None, :] > 0, 0.0, NEG)
    bias = bias + pad
    h, dk = spec.num_heads, spec.d_kv
    for i in range(spec.num_layers):
        layer = blocks[str(i)]["layer"]
        sa = layer["0"]["SelfAttention"]
        y = rms_norm(layer["0"]["layer_norm"]["weight"], x, spec.eps)
        q = (y @ sa["q"]["kernel"]).reshape(b, length, h, dk)
        k = (y @ sa["k"]["kernel"]).reshape(b, length, h, dk)
        v = (y @ sa["v"]["kernel"]).reshape(b, length, h, dk)
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) + bias
        w = jax.nn.softmax(s, axis=-1)
        o = jnp.einsum("bhqk,bkhd->bqhd", w, v).reshape(b, length, h * dk)
        x = x + o @ sa["o"]["kernel"]
        ff = layer["1"]["DenseReluDense"]
        y = rms_norm(layer["1"]["layer_norm"]["weight"], x, spec.eps)
        x = x + jax.nn.relu(y @ ff["wi"]["kernel"]) @ ff["wo"]["kernel"]
    return rms_norm(p["encoder"]["final_layer_norm"]["weight"], x, spec.eps)
