"""Self-attention that costs what its mask keeps: dense (the reference), blocked sliding windows,
chunked global attention with a hand-written backward pass, splash on TPU, cuDNN on GPU, and
:func:`attend`, which picks one by backend and platform.

Every function takes ``q``, ``k``, ``v`` as (batch, seq, heads, head_dim), the layout of the
networks' projections and of ``keras.ops.dot_product_attention``, and returns the context in the
same shape. Which keys a query sees is described by plain arrays, never by an (S, S) mask, so the
sparse paths need not build one:

* ``attention_mask`` (batch, seq), 1 = real token: padding keys are never attended;
* ``segment_ids`` (batch, seq), optional: document of each token in a packed block (0 =
  padding); a query then sees only keys of its own document;
* ``window`` (ModernBERT's ``local_attention``): a query sees keys at distance
  ``<= window // 2``; None = global.

Rows of padding queries are left unspecified (finite, never NaN): the networks never read them
(their hidden states reach neither real tokens nor the loss). The dense path keeps today's values
there; the sparse paths let a padding query attend the padding keys near it, which keeps every
row non-empty (splash requires that) without building the dense mask.

:func:`dense_attention`, :func:`blocked_local_attention` and :func:`chunked_attention` run on every
backend (keras.ops); the splash and cuDNN paths import JAX inside themselves.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable

import keras
import numpy as np
from keras import ops

from tpulm.errors import TpulmError
from tpulm.model.config import ATTENTION_MODES

# Block of the blocked path: queries in blocks of this many attend the key blocks within reach.
# With ModernBERT's window (128, 64 each side) a block of 64 reads 3 x 64 = 192 keys per query
# for the 129 it needs (measured by benchmarks/long_context.py against 32 and 128).
LOCAL_BLOCK = 64
# Queries per chunk of the chunked global path: (batch, heads, 512, seq) logits at a time; 256 to
# 1,024 ran within 3% of each other at seq 4,096 on CPU (TensorFlow XLA). Sequences up to one
# chunk stay on the dense path: they would save no memory, and outside XLA (graph mode, eager)
# the chunk loop is compiled by XLA on its own, seconds per model built.
GLOBAL_BLOCK = 512
# Splash's tiles (its default BlockSizes; the kernel needs key tiles in multiples of the TPU's
# 128 lanes); sequences are padded to a multiple of it.
SPLASH_BLOCK = 128
# A finite "minus infinity" for masked logits in float32: exp() underflows to exactly 0 while a
# row that masks everything still gets a finite softmax (what Keras' own masking does).
_MASKED = -1e9

# Signature of every path: (q, k, v, *, attention_mask, segment_ids, window, scale) -> context.
AttentionFn = Callable[..., object]


def dense_mask(attention_mask, segment_ids=None, window: int | None = None):
    """The boolean mask of the dense path, as the networks build it today.

    Args:
        attention_mask: (batch, seq) int, 1 = real token.
        segment_ids: (batch, seq) int or None; 0 = padding.
        window: sliding window in tokens (keys at distance ``<= window // 2``), None = global.

    Returns:
        (batch, 1, 1, seq) without documents or window, else (batch, 1, seq, seq); True = attend.
    """
    keys = ops.not_equal(attention_mask, 0)  # (batch, seq)
    if segment_ids is None:
        mask = keys[:, None, None, :]
    else:
        same = ops.equal(segment_ids[:, :, None], segment_ids[:, None, :])
        real_keys = ops.logical_and(keys, ops.not_equal(segment_ids, 0))
        mask = ops.logical_and(same, real_keys[:, None, :])[:, None, :, :]
    if window is None:
        return mask
    index = ops.arange(ops.shape(attention_mask)[1], dtype="int32")
    near = ops.abs(index[:, None] - index[None, :]) <= window // 2
    return ops.logical_and(mask, near[None, None, :, :])


def dense_attention(q, k, v, mask, *, scale: float, probs_dropout: Callable | None = None):
    """Masked softmax attention over all (query, key) pairs: the reference every path matches.

    Exactly what the networks compute today: ``keras.ops.dot_product_attention``, or, with
    dropout on the probabilities (which that op lacks), an explicit float32 softmax.

    Args:
        q, k, v: (batch, seq, heads, head_dim).
        mask: bool, broadcastable to (batch, heads, seq, seq), True = attend
            (see :func:`dense_mask`).
        scale: multiplies the logits (``head_dim ** -0.5``).
        probs_dropout: applied to the probabilities, or None.

    Returns:
        The context, (batch, seq, heads, head_dim).
    """
    if probs_dropout is None:
        return ops.dot_product_attention(q, k, v, mask=mask, scale=scale)
    logits = ops.cast(ops.einsum("bqhd,bkhd->bhqk", q, k), "float32") * scale
    logits = ops.where(mask, logits, ops.cast(_MASKED, "float32"))
    probs = probs_dropout(ops.cast(ops.softmax(logits, axis=-1), v.dtype))
    return ops.einsum("bhqk,bkhd->bqhd", probs, v)


def token_segments(attention_mask, segment_ids=None):
    """(batch, seq) int32 ids such that a query may attend a key iff their ids are equal.

    The document id of real tokens (1 for every real token without documents), 0 for padding:
    real queries see exactly the keys the dense mask gives them, padding sees padding.
    """
    real = ops.cast(ops.not_equal(attention_mask, 0), "int32")
    return real if segment_ids is None else ops.cast(segment_ids, "int32") * real


def _static_length(x) -> int | None:
    length = x.shape[1]
    return None if length is None else int(length)


def _pad_seq(x, before: int, after: int, value=0):
    """``x`` (batch, seq, ...) padded along seq."""
    widths = [(0, 0)] * len(x.shape)
    widths[1] = (before, after)
    return ops.pad(x, widths, constant_values=value)


def _neighbourhoods(x, blocks: int, block: int, reach: int):
    """(batch, blocks, (2 reach + 1) block, ...): for each query block, the key blocks
    ``i - reach .. i + reach`` of ``x``, which is already padded by ``reach`` blocks each side."""
    rest = tuple(x.shape[2:])
    views = [ops.reshape(x[:, j * block: (j + blocks) * block], (-1, blocks, block, *rest))
             for j in range(2 * reach + 1)]
    return ops.concatenate(views, axis=2)


def _window_band(block: int, reach: int, radius: int) -> np.ndarray:
    """(block, span) bool: which keys of a neighbourhood lie in a query's window. The same for
    every block: query ``a`` of block ``i`` is at ``i block + a``, key ``b`` of its neighbourhood
    at ``(i - reach) block + b``."""
    span = (2 * reach + 1) * block
    offset = np.arange(span)[None, :] - reach * block - np.arange(block)[:, None]
    return np.abs(offset) <= radius


def blocked_local_attention(q, k, v, segments, *, window: int, scale: float,
                            block: int = LOCAL_BLOCK):
    """Sliding-window attention in query blocks against the key blocks within reach only.

    Time and memory grow as seq x window instead of seq^2: each block of ``block`` queries
    attends its ``2 ceil(radius / block) + 1`` neighbouring key blocks, masked to the window and
    to equal ``segments``. Static sequence length (XLA, JAX); any length (padded to the block).

    Args:
        q, k, v: (batch, seq, heads, head_dim), seq static.
        segments: (batch, seq) int, see :func:`token_segments`.
        window: keys at distance ``<= window // 2`` are seen.
        scale: multiplies the logits.
        block: queries per block.

    Returns:
        The context, (batch, seq, heads, head_dim).
    """
    seq = _static_length(q)
    radius = window // 2
    reach = -(-radius // block)  # key blocks needed on each side
    blocks = -(-seq // block)
    tail, halo = blocks * block - seq, reach * block
    # Positions added past the end and around the keys get segment -1: no real or padding token
    # sees them; an added query sees itself (the diagonal is in every window), so no row is empty.
    qb = ops.reshape(_pad_seq(q, 0, tail), (-1, blocks, block, *q.shape[2:]))
    kb, vb = (_neighbourhoods(_pad_seq(x, halo, tail + halo), blocks, block, reach)
              for x in (k, v))
    seg = ops.cast(segments, "int32")
    seg_q = _keys_as_chunks(seg, blocks, block)
    seg_k = _neighbourhoods(_pad_seq(seg, halo, tail + halo, -1), blocks, block, reach)
    keep = ops.logical_and(ops.equal(seg_q[..., None], seg_k[:, :, None, :]),
                           _window_band(block, reach, radius))  # (batch, blocks, block, span)
    logits = ops.cast(ops.einsum("bnqhd,bnkhd->bnhqk", qb, kb), "float32") * scale
    logits = ops.where(keep[:, :, None], logits, ops.cast(_MASKED, "float32"))
    probs = ops.cast(ops.softmax(logits, axis=-1), v.dtype)  # (batch, blocks, heads, block, span)
    context = ops.einsum("bnhqk,bnkhd->bnqhd", probs, vb)
    context = ops.reshape(context, (-1, blocks * block, *q.shape[2:]))
    return context[:, :seq]


def _as_chunks(x, chunks: int, block: int):
    """(batch, heads, seq, d) -> (batch, heads, chunks, block, d), seq padded with zeros."""
    tail = chunks * block - x.shape[2]
    x = ops.pad(x, [(0, 0), (0, 0), (0, tail), (0, 0)])
    return ops.reshape(x, (-1, x.shape[1], chunks, block, x.shape[-1]))


def _keys_as_chunks(keys, chunks: int, block: int):
    """(batch, seq) -> (batch, chunks, block): each query's own ``keys`` entry (segment); the
    queries padding the last chunk get -1, in no document (their rows are dropped)."""
    tail = chunks * block - keys.shape[1]
    return ops.reshape(_pad_seq(keys, 0, tail, -1), (-1, chunks, block))


def _from_chunks(x, seq: int):
    """(batch, heads, chunks, block, d) -> (batch, heads, seq, d)."""
    return ops.reshape(x, (-1, x.shape[1], x.shape[2] * x.shape[3], x.shape[-1]))[:, :, :seq]


def _chunk_logits(q_chunk, k, chunk_keys, keys, documents: bool):
    """float32 logits of a chunk of queries against every key, (batch, heads, block, seq).

    ``q_chunk`` (batch, heads, block, head_dim), already scaled; k (batch, heads, seq,
    head_dim). ``keys`` (batch, seq) float, ``chunk_keys`` (batch, block) the chunk's own: with
    ``documents`` the token segments (a query sees keys of its own segment), else 1 for real
    tokens and 0 for padding (every query sees the real keys: the dense path's rows).
    """
    logits = ops.cast(ops.einsum("bhqd,bhkd->bhqk", q_chunk, k), "float32")
    if documents:
        keep = ops.equal(chunk_keys[:, None, :, None], keys[:, None, None, :])
        return ops.where(keep, logits, ops.cast(_MASKED, "float32"))
    return logits + (keys[:, None, None, :] - 1.0) * -_MASKED  # padding keys: + _MASKED


def _put(buffer, i, chunk):
    """``buffer`` (batch, heads, chunks, block, d) with chunk ``i`` replaced."""
    return ops.slice_update(buffer, (0, 0, i, 0, 0), chunk[:, :, None])


def _chunked_forward(q, k, v, keys, documents, block):
    """Context and log-sum-exp (batch, heads, seq, 1) of each query's softmax, one chunk of
    queries after the other (a loop, so only one chunk's (block, seq) scores are alive)."""
    seq = q.shape[2]
    chunks = -(-seq // block)
    q_chunks = _as_chunks(q, chunks, block)
    chunk_keys = _keys_as_chunks(keys, chunks, block)

    def one_chunk(i, carry):
        out, lse = carry
        logits = _chunk_logits(ops.take(q_chunks, i, axis=2), k,
                               ops.take(chunk_keys, i, axis=1), keys, documents)
        peak = ops.max(logits, axis=-1, keepdims=True)
        weights = ops.exp(logits - peak)
        total = ops.sum(weights, axis=-1, keepdims=True)
        # normalised after the product: block x head_dim divisions instead of block x seq
        context = ops.einsum("bhqk,bhkd->bhqd", ops.cast(weights, v.dtype), v)
        context = ops.cast(ops.cast(context, "float32") / total, v.dtype)
        return _put(out, i, context), _put(lse, i, peak + ops.log(total))

    empty = (ops.zeros_like(q_chunks, dtype=v.dtype),
             ops.zeros_like(q_chunks[..., :1], dtype="float32"))
    out, lse = ops.fori_loop(0, chunks, one_chunk, empty)
    return _from_chunks(out, seq), _from_chunks(lse, seq)


def _chunked_backward(q, k, v, keys, documents, block, out, lse, d_out):
    """Gradients of q, k, v, each chunk's probabilities recomputed from its log-sum-exp."""
    seq = q.shape[2]
    chunks = -(-seq // block)
    # d logits = p * (d p - rowsum(d p * p)), and rowsum(d p * p) = rowsum(d out * out)
    delta = ops.sum(ops.cast(d_out, "float32") * ops.cast(out, "float32"), axis=-1,
                    keepdims=True)
    q_chunks, d_out_chunks, lse_chunks, delta_chunks = (
        _as_chunks(x, chunks, block) for x in (q, d_out, lse, delta))  # padded rows: d_out 0
    chunk_keys = _keys_as_chunks(keys, chunks, block)

    def one_chunk(i, carry):
        d_q, d_k, d_v = carry
        q_chunk, d_chunk = ops.take(q_chunks, i, axis=2), ops.take(d_out_chunks, i, axis=2)
        logits = _chunk_logits(q_chunk, k, ops.take(chunk_keys, i, axis=1), keys, documents)
        probs = ops.exp(logits - ops.take(lse_chunks, i, axis=2))
        d_v = d_v + ops.einsum("bhqk,bhqd->bhkd", ops.cast(probs, v.dtype), d_chunk)
        d_probs = ops.cast(ops.einsum("bhqd,bhkd->bhqk", d_chunk, v), "float32")
        d_logits = ops.cast(probs * (d_probs - ops.take(delta_chunks, i, axis=2)), q.dtype)
        d_k = d_k + ops.einsum("bhqk,bhqd->bhkd", d_logits, q_chunk)
        return _put(d_q, i, ops.einsum("bhqk,bhkd->bhqd", d_logits, k)), d_k, d_v

    empty = (ops.zeros_like(q_chunks), ops.zeros_like(k), ops.zeros_like(v))
    d_q, d_k, d_v = ops.fori_loop(0, chunks, one_chunk, empty)
    return _from_chunks(d_q, seq), d_k, d_v


def _chunked_heads_first(q, k, v, keys, documents: bool, block: int):
    """:func:`chunked_attention` on (batch, heads, seq, head_dim) inputs, ``q`` already scaled;
    ``keys`` as :func:`_chunk_logits` takes them, float (a custom gradient's inputs are all
    differentiable)."""
    block = min(block, q.shape[2])

    @ops.custom_gradient
    def run(q, k, v, keys):
        out, lse = _chunked_forward(q, k, v, keys, documents, block)

        def grad(*args, upstream=None):  # Keras: the upstream gradient, positional on TF
            d_out = args[0] if upstream is None else upstream
            return (*_chunked_backward(q, k, v, keys, documents, block, out, lse, d_out),
                    ops.zeros_like(keys))

        return out, grad

    return run(q, k, v, keys)


def chunked_attention(q, k, v, attention_mask, segment_ids=None, *, scale: float,
                      block: int = GLOBAL_BLOCK):
    """Exact global attention in query chunks, with a backward pass written out.

    Each chunk of ``block`` queries attends every key of its segment (an exact softmax over the
    whole row); the backward pass recomputes each chunk's probabilities from the saved
    log-sum-exp (FlashAttention's backward, over query chunks: Rabe & Staats, "Self-attention
    does not need O(n^2) memory"). The chunks run in a loop, one after the other, so memory
    grows as block x seq instead of seq^2 (XLA's temporaries for one layer at seq 4,096: 113 MiB,
    dense 776), and on CPU a layer's forward and backward run 2.5x faster than the framework's
    gradient of the dense path (460 vs 1,161 ms at 4,096, TensorFlow XLA): that gradient's
    passes over the (seq, seq) softmax are what cost there, not the matmuls.

    Args:
        q, k, v: (batch, seq, heads, head_dim), seq static.
        attention_mask: (batch, seq) int, 1 = real token.
        segment_ids: (batch, seq) int documents (0 = padding), or None.
        scale: multiplies the logits.
        block: queries per chunk.

    Returns:
        The context, (batch, seq, heads, head_dim).
    """
    documents = segment_ids is not None
    keys = token_segments(attention_mask, segment_ids)
    heads_first = (0, 2, 1, 3)
    q, k, v = (ops.transpose(x, heads_first) for x in (q * ops.cast(scale, q.dtype), k, v))
    out = _chunked_heads_first(q, k, v, ops.cast(keys, "float32"), documents, block)
    return ops.transpose(out, heads_first)


def _splash_kernel(seq: int, heads: int, radius: int | None, block: int, interpret: bool):
    """The splash kernel for one example's (heads, seq, seq) mask. Built at each trace, not
    cached: it holds arrays of the trace it was made in (JAX caches the numpy mask analysis)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_kernel as kernel,
    )
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_mask as masks,
    )

    shape = (seq, seq)
    one = masks.FullMask(shape) if radius is None else masks.LocalMask(shape, (radius, radius), 0)
    sizes = kernel.BlockSizes(
        block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
        block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
    return kernel.make_splash_mha(masks.MultiHeadMask([one] * heads), block_sizes=sizes,
                                  head_shards=1, q_seq_shards=1, interpret=interpret)


def _splash_shard(q, k, v, segments, radius: int | None, interpret: bool):
    """Splash on one device's shard: q, k, v (batch, heads, seq, head_dim), seq a multiple of
    ``SPLASH_BLOCK``."""
    import jax
    from jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_kernel import (
        SegmentIds,
    )

    _, heads, seq, _ = q.shape
    kernel = _splash_kernel(seq, heads, radius, SPLASH_BLOCK, interpret)
    return jax.vmap(kernel)(q, k, v, SegmentIds(segments, segments))


def splash_attention(q, k, v, segments, *, window: int | None, scale: float, mesh=None,
                     batch_axis: str | None = None, head_axis: str | None = None,
                     interpret: bool = False):
    """Splash attention (JAX's block-sparse flash kernel for TPU): masked blocks are skipped.

    ``LocalMask`` for a window, ``FullMask`` for global attention, ``SegmentIds`` for padding
    and documents. Sequences are padded to a multiple of ``SPLASH_BLOCK`` (padded positions get
    segment -1). A Mosaic kernel cannot be partitioned automatically: with a ``mesh`` it runs
    under ``jax.shard_map``, the batch split over ``batch_axis`` and heads over ``head_axis``.

    Args:
        q, k, v: (batch, seq, heads, head_dim) JAX arrays.
        segments: (batch, seq) int, see :func:`token_segments`.
        window: keys at distance ``<= window // 2`` are seen; None = global.
        scale: multiplies the logits (applied to ``q``: the kernel does not scale).
        mesh: a ``jax.sharding.Mesh`` the inputs are sharded over, or None.
        batch_axis, head_axis: mesh axes of the batch and of the heads (None = not split).
        interpret: run the kernel in Pallas' interpreter (CPU tests).

    Returns:
        The context, (batch, seq, heads, head_dim).
    """
    import jax
    import jax.numpy as jnp

    seq = q.shape[1]
    tail = -(-seq // SPLASH_BLOCK) * SPLASH_BLOCK - seq
    # (batch, heads, padded seq, head_dim), the kernel's layout
    q, k, v = (jnp.transpose(jnp.pad(x, ((0, 0), (0, tail), (0, 0), (0, 0))), (0, 2, 1, 3))
               for x in (q * scale, k, v))
    segments = jnp.pad(jnp.asarray(segments, jnp.int32), ((0, 0), (0, tail)), constant_values=-1)
    radius = None if window is None else window // 2
    run = functools.partial(_splash_shard, radius=radius, interpret=interpret)
    if mesh is not None:
        spec = jax.sharding.PartitionSpec
        run = jax.shard_map(run, mesh=mesh, check_vma=False,
                            in_specs=(spec(batch_axis, head_axis), spec(batch_axis, head_axis),
                                      spec(batch_axis, head_axis), spec(batch_axis)),
                            out_specs=spec(batch_axis, head_axis))
    context = run(q, k, v, segments)
    return jnp.transpose(context, (0, 2, 1, 3))[:, :seq]


def cudnn_applies(q, segment_ids) -> bool:
    """Whether cuDNN's flash attention takes these inputs: 16-bit floats, head_dim a multiple
    of 8 up to 128, an even length (its masked backward pass), and no documents (their mask
    would be a full (seq, seq) bias: nothing saved over dense)."""
    head_dim, seq = q.shape[-1], q.shape[1]
    half = keras.backend.standardize_dtype(q.dtype) in ("float16", "bfloat16")
    return (half and head_dim % 8 == 0 and head_dim <= 128 and seq is not None and seq % 2 == 0
            and segment_ids is None)


# ---- the paths attend() chooses from: (q, k, v, *, attention_mask, segment_ids, window, scale)

def _dense(q, k, v, *, attention_mask, segment_ids, window, scale):
    return dense_attention(q, k, v, dense_mask(attention_mask, segment_ids, window), scale=scale)


def _blocked_span(window: int, block: int = LOCAL_BLOCK) -> int:
    """Keys each query block of the blocked path reads: its block and those within reach."""
    return (2 * -(-(window // 2) // block) + 1) * block


def _blocked(q, k, v, *, attention_mask, segment_ids, window, scale):
    seq = _static_length(q)
    # Nothing to skip, no static blocks, or blocks that would read at least every key (seq 128
    # with a 128 window: 192 keys a query against 128): the dense masked path is then cheaper.
    if window is None or seq is None or _blocked_span(window) >= seq:
        return _dense(q, k, v, attention_mask=attention_mask, segment_ids=segment_ids,
                      window=window, scale=scale)
    return blocked_local_attention(q, k, v, token_segments(attention_mask, segment_ids),
                                   window=window, scale=scale)


def _chunked(q, k, v, *, attention_mask, segment_ids, window, scale):
    seq = _static_length(q)
    if seq is None or seq <= GLOBAL_BLOCK:  # chunks need a static length, and more than one
        return _dense(q, k, v, attention_mask=attention_mask, segment_ids=segment_ids,
                      window=window, scale=scale)
    return chunked_attention(q, k, v, attention_mask, segment_ids, scale=scale,
                             block=GLOBAL_BLOCK)


def _cudnn(q, k, v, *, attention_mask, segment_ids, window, scale):
    if not cudnn_applies(q, segment_ids):
        return _chunked(q, k, v, attention_mask=attention_mask, segment_ids=segment_ids,
                        window=window, scale=scale)
    import jax

    return jax.nn.dot_product_attention(q, k, v, mask=dense_mask(attention_mask), scale=scale,
                                        implementation="cudnn")


def _keras_mesh():
    """``(mesh, batch_axis, head_axis)`` of the Keras distribution in force, or Nones."""
    dist = keras.distribution.distribution()
    if dist is None:
        return None, None, None
    mesh = dist.device_mesh.backend_mesh
    head_axis = "model" if "model" in mesh.axis_names else None
    return mesh, dist.batch_dim_name, head_axis


def _splash(q, k, v, *, attention_mask, segment_ids, window, scale):
    mesh, batch_axis, head_axis = _keras_mesh()
    if head_axis is not None and q.shape[2] % mesh.shape[head_axis]:
        head_axis = None  # heads that do not divide evenly stay whole on each device
    # Off TPU (tests on CPU) the kernel can only run in Pallas' interpreter.
    return splash_attention(q, k, v, token_segments(attention_mask, segment_ids), window=window,
                            scale=scale, mesh=mesh, batch_axis=batch_axis, head_axis=head_axis,
                            interpret=_jax_platform() != "tpu")


@dataclasses.dataclass(frozen=True)
class AttentionPaths:
    """The functions computing global and sliding-window layers on one backend and platform."""

    global_: AttentionFn
    local: AttentionFn


DENSE = AttentionPaths(global_=_dense, local=_dense)
# (Keras backend, device platform) -> paths of --attention auto; "*" = any platform.
AUTO_PATHS = {
    ("tensorflow", "*"): AttentionPaths(global_=_chunked, local=_blocked),
    ("jax", "gpu"): AttentionPaths(global_=_cudnn, local=_blocked),
    ("jax", "tpu"): AttentionPaths(global_=_splash, local=_splash),
    ("jax", "*"): AttentionPaths(global_=_chunked, local=_blocked),  # CPU
}
MODES = ATTENTION_MODES


_TARGET_PLATFORM: list[str] = []  # set by target_platform(): the platform being compiled for


@contextlib.contextmanager
def target_platform(platform: str):
    """Trace for ``platform`` rather than this host's devices: ``tpulm plan`` lowers the train
    step for a TPU from a CPU host, and must lower the path a TPU would take (splash)."""
    _TARGET_PLATFORM.append(platform)
    try:
        yield
    finally:
        _TARGET_PLATFORM.pop()


def _jax_platform() -> str:
    if _TARGET_PLATFORM:
        return _TARGET_PLATFORM[-1]
    import jax

    return jax.devices()[0].platform


# Keras backend -> the platform its computations run on, as AUTO_PATHS names it.
_PLATFORMS: dict[str, Callable[[], str]] = {"jax": _jax_platform, "tensorflow": lambda: "*"}


def select_paths(mode: str = "auto", backend: str | None = None,
                 platform: str | None = None) -> AttentionPaths:
    """The attention paths of ``mode`` for a backend and platform (default: the current ones).

    Raises:
        TpulmError: an unknown mode.
    """
    if mode not in MODES:
        raise TpulmError(f"attention mode {mode!r} is not one of {', '.join(MODES)} "
                         "(--attention): use auto or dense")
    if mode == "dense":
        return DENSE
    backend = backend or keras.backend.backend()
    platform = platform or _PLATFORMS.get(backend, lambda: "*")()
    return AUTO_PATHS.get((backend, platform)) or AUTO_PATHS.get((backend, "*"), DENSE)


def attend(q, k, v, *, attention_mask, segment_ids=None, window: int | None = None,
           scale: float | None = None, mode: str = "auto", probs_dropout: Callable | None = None):
    """Multi-head self-attention by the cheapest exact path for the backend and platform.

    Args:
        q, k, v: (batch, seq, heads, head_dim).
        attention_mask: (batch, seq) int, 1 = real token.
        segment_ids: (batch, seq) int documents (0 = padding), or None.
        window: sliding window in tokens (keys at distance ``<= window // 2``), None = global.
        scale: multiplies the logits; default ``head_dim ** -0.5``.
        mode: ``"auto"`` (see ``AUTO_PATHS``) or ``"dense"`` (the masked reference).
        probs_dropout: dropout on the attention probabilities (training only), or None; the
            dense path is then taken (only it materialises the probabilities).

    Returns:
        The context, (batch, seq, heads, head_dim), in ``v``'s dtype.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if probs_dropout is not None:
        mask = dense_mask(attention_mask, segment_ids, window)
        return dense_attention(q, k, v, mask, scale=scale, probs_dropout=probs_dropout)
    seq = _static_length(q)
    if window is not None and seq is not None and window // 2 >= seq - 1:
        window = None  # the window spans the whole sequence: a global layer
    paths = select_paths(mode)
    path = paths.global_ if window is None else paths.local
    return path(q, k, v, attention_mask=attention_mask, segment_ids=segment_ids, window=window,
                scale=scale)
