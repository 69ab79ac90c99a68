"""dot, tensordot, outer and einsum on dot_general (XLA's DotGeneral, one GEMM)."""

from . import _tessera as C
from ._convert import asarray


def dot(a, b):
    """numpy.dot for 0-2 dimensional operands (matmul, or a scalar product)."""
    a, b = asarray(a), asarray(b)
    if a.ndim == 0 or b.ndim == 0:
        return C.multiply(a, b)
    if a.ndim > 2 or b.ndim > 2:
        raise ValueError("tessera.dot takes operands of up to 2 dimensions; use matmul or einsum for batches")
    return C.matmul(a, b)


def outer(a, b):
    a, b = C.ravel(asarray(a)), C.ravel(asarray(b))
    return C.multiply(C.expand_dims(a, 1), C.expand_dims(b, 0))


def tensordot(a, b, axes=2):
    a, b = asarray(a), asarray(b)
    if isinstance(axes, int):
        a_axes = list(range(a.ndim - axes, a.ndim))
        b_axes = list(range(axes))
    else:
        a_axes, b_axes = axes
        a_axes = [a_axes] if isinstance(a_axes, int) else list(a_axes)
        b_axes = [b_axes] if isinstance(b_axes, int) else list(b_axes)
    return C.dot_general(a, b, a_axes, b_axes)


def _parse(subscripts, count):
    if "." in subscripts:
        raise NotImplementedError("einsum: ellipsis ('...') is not supported; name every axis")
    subscripts = subscripts.replace(" ", "")
    if "->" in subscripts:
        inputs, output = subscripts.split("->")
    else:
        inputs = subscripts
        letters = inputs.replace(",", "")
        output = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    terms = inputs.split(",")
    if len(terms) != count:
        raise ValueError(f"einsum: '{subscripts}' names {len(terms)} operands, {count} given")
    for t in terms:
        if len(set(t)) != len(t):
            raise NotImplementedError(f"einsum: a repeated index within one operand ('{t}', a diagonal) is not supported")
    return terms, output


def _reduce_unique(x, term, keep):
    # Sums the axes whose letters appear nowhere else.
    drop = [i for i, c in enumerate(term) if c not in keep]
    if drop:
        x = C.sum(x, drop)
        term = "".join(c for c in term if c in keep)
    return x, term


def _einsum_pair(a, ta, b, tb, keep):
    a, ta = _reduce_unique(a, ta, set(tb) | set(keep))
    b, tb = _reduce_unique(b, tb, set(ta) | set(keep))
    batch = [c for c in ta if c in tb and c in keep]
    contract = [c for c in ta if c in tb and c not in keep]
    out = C.dot_general(
        a, b, [ta.index(c) for c in contract], [tb.index(c) for c in contract],
        [ta.index(c) for c in batch], [tb.index(c) for c in batch],
    )
    term = "".join(batch) + "".join(c for c in ta if c not in batch and c not in contract) + "".join(
        c for c in tb if c not in batch and c not in contract
    )
    return out, term


def einsum(subscripts, *operands):
    """numpy.einsum over explicit indices ('bij,bjk->bik'); operands are contracted left to
    right, each pair as one dot_general."""
    arrays = [asarray(o) for o in operands]
    terms, output = _parse(subscripts, len(arrays))
    for a, t in zip(arrays, terms):
        if a.ndim != len(t):
            raise ValueError(f"einsum: operand '{t}' has {a.ndim} dimensions, the subscripts name {len(t)}")
    x, term = arrays[0], terms[0]
    for k in range(1, len(arrays)):
        later = set("".join(terms[k + 1:])) | set(output)
        x, term = _einsum_pair(x, term, arrays[k], terms[k], later)
    x, term = _reduce_unique(x, term, set(output))
    missing = [c for c in output if c not in term]
    if missing:
        raise ValueError(f"einsum: output indices {missing} appear in no operand")
    perm = [term.index(c) for c in output]
    if perm != list(range(len(perm))):
        x = C.transpose(x, perm)
    return x
