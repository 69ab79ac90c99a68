"""Pytrees, as in JAX: nested tuples, lists, dicts (keys sorted), namedtuples and None
(a node without leaves); everything else is a leaf. Transforms flatten their arguments
and results with these functions and rebuild them from a PyTreeDef."""

__all__ = [
    "PyTreeDef",
    "tree_flatten",
    "tree_unflatten",
    "tree_leaves",
    "tree_structure",
    "tree_map",
    "tree_paths",
]

_LEAF, _NONE, _TUPLE, _LIST, _DICT, _NAMEDTUPLE = range(6)
_KIND_NAMES = ("*", "None", "tuple", "list", "dict", "namedtuple")


class PyTreeDef:
    """The structure of a pytree: its node kinds, dict keys and leaf positions (hashable)."""

    __slots__ = ("kind", "meta", "children", "num_leaves", "_hash")

    def __init__(self, kind, meta, children):
        self.kind = kind
        self.meta = meta  # dict keys (sorted tuple) or the namedtuple class
        self.children = children
        self.num_leaves = 1 if kind == _LEAF else sum(c.num_leaves for c in children)
        self._hash = hash((kind, meta, children))

    def __eq__(self, other):
        return (
            isinstance(other, PyTreeDef)
            and self._hash == other._hash
            and self.kind == other.kind
            and self.meta == other.meta
            and self.children == other.children
        )

    def __hash__(self):
        return self._hash

    def __repr__(self):
        return f"PyTreeDef({self._text()})"

    def _text(self):
        if self.kind == _LEAF:
            return "*"
        if self.kind == _NONE:
            return "None"
        inner = [c._text() for c in self.children]
        if self.kind == _DICT:
            return "{" + ", ".join(f"{k!r}: {v}" for k, v in zip(self.meta, inner)) + "}"
        if self.kind == _LIST:
            return "[" + ", ".join(inner) + "]"
        if self.kind == _NAMEDTUPLE:
            return f"{self.meta.__name__}(" + ", ".join(inner) + ")"
        return "(" + ", ".join(inner) + ("," if len(inner) == 1 else "") + ")"

    @property
    def num_nodes(self):
        return 1 + sum(c.num_nodes for c in self.children)

    def unflatten(self, leaves):
        return tree_unflatten(self, leaves)


_LEAF_DEF = PyTreeDef(_LEAF, None, ())
_NONE_DEF = PyTreeDef(_NONE, None, ())


def _flatten(tree, leaves, is_leaf):
    if is_leaf is not None and is_leaf(tree):
        leaves.append(tree)
        return _LEAF_DEF
    t = type(tree)
    if t is tuple:
        return PyTreeDef(_TUPLE, None, tuple(_flatten(c, leaves, is_leaf) for c in tree))
    if t is list:
        return PyTreeDef(_LIST, None, tuple(_flatten(c, leaves, is_leaf) for c in tree))
    if t is dict:
        try:
            keys = tuple(sorted(tree))
        except TypeError:
            raise TypeError(f"pytree dict keys must be sortable (all str, or all int): {list(tree)!r:.80}") from None
        return PyTreeDef(_DICT, keys, tuple(_flatten(tree[k], leaves, is_leaf) for k in keys))
    if tree is None:
        return _NONE_DEF
    if isinstance(tree, tuple) and hasattr(t, "_fields"):
        return PyTreeDef(_NAMEDTUPLE, t, tuple(_flatten(c, leaves, is_leaf) for c in tree))
    leaves.append(tree)
    return _LEAF_DEF


def tree_flatten(tree, is_leaf=None):
    """(leaves, treedef): the leaves in a deterministic order (dict keys sorted)."""
    leaves = []
    treedef = _flatten(tree, leaves, is_leaf)
    return leaves, treedef


def _build(treedef, it):
    kind = treedef.kind
    if kind == _LEAF:
        return next(it)
    if kind == _NONE:
        return None
    children = [_build(c, it) for c in treedef.children]
    if kind == _TUPLE:
        return tuple(children)
    if kind == _LIST:
        return children
    if kind == _DICT:
        return dict(zip(treedef.meta, children))
    return treedef.meta(*children)


def tree_unflatten(treedef, leaves):
    """The pytree of structure `treedef` with `leaves` in flattening order."""
    leaves = list(leaves)
    if len(leaves) != treedef.num_leaves:
        raise ValueError(f"tree_unflatten: {treedef} has {treedef.num_leaves} leaves, got {len(leaves)}")
    return _build(treedef, iter(leaves))


def tree_leaves(tree, is_leaf=None):
    return tree_flatten(tree, is_leaf)[0]


def tree_structure(tree, is_leaf=None):
    return tree_flatten(tree, is_leaf)[1]


def tree_map(f, tree, *rest, is_leaf=None):
    """f applied leaf by leaf; `rest` are trees of the same structure as `tree`."""
    leaves, treedef = tree_flatten(tree, is_leaf)
    others = []
    for i, r in enumerate(rest):
        r_leaves, r_def = tree_flatten(r, is_leaf)
        if r_def != treedef:
            raise ValueError(f"tree_map: tree {i + 1} has structure {r_def}, expected {treedef}")
        others.append(r_leaves)
    return tree_unflatten(treedef, [f(*xs) for xs in zip(leaves, *others)])


def _paths(tree, prefix, out):
    if isinstance(tree, dict):
        for k in sorted(tree):
            _paths(tree[k], f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(tree, (list, tuple)):
        for i, c in enumerate(tree):
            _paths(c, f"{prefix}.{i}" if prefix else str(i), out)
    elif tree is not None:
        out.append(prefix)


def tree_paths(tree):
    """Dotted paths of the leaves, in flattening order ("layers.0.w"): tessera's checkpoint names."""
    out = []
    _paths(tree, "", out)
    return out


def broadcast_prefix(prefix, tree, what, is_leaf=None):
    """One value per leaf of `tree` from `prefix`, a pytree that is a prefix of `tree`
    (JAX's in_axes / in_shardings rule: a leaf of the prefix covers a whole subtree)."""
    out = []

    def walk(p, t, path):
        if not isinstance(p, (tuple, list, dict)):
            out.extend([p] * tree_structure(t, is_leaf).num_leaves)
            return
        if type(p) is dict and type(t) is dict:
            if sorted(p) != sorted(t):
                raise ValueError(f"{what}: at {path or 'the top'} the keys {sorted(p)} do not match {sorted(t)}")
            for k in sorted(t):
                walk(p[k], t[k], f"{path}.{k}" if path else str(k))
            return
        if isinstance(p, (list, tuple)) and isinstance(t, (list, tuple)):
            if len(p) != len(t):
                raise ValueError(f"{what}: at {path or 'the top'} {len(p)} entries for {len(t)} values")
            for i, (pc, tc) in enumerate(zip(p, t)):
                walk(pc, tc, f"{path}.{i}" if path else str(i))
            return
        raise ValueError(f"{what}: at {path or 'the top'} {p!r:.60} does not match the value's structure")

    walk(prefix, tree, "")
    return out
