"""The fit's rewrites: each a small registered function with its precondition, changing a float graph so a
delegate takes a node it refuses while the model computes the same thing.

    batch-axis          ADD/MUL of a [100,64] and a [1,100,64]: the lower-rank operand given its leading axes
                        (a constant read in the new shape, a run-time tensor through a RESHAPE); the GPU's
                        broadcast takes equal ranks only
    mean-as-pool        MEAN over H and W of an NHWC tensor as AVERAGE_POOL_2D over the whole map (Core ML has
                        no MEAN without keep_dims); a dense layer after it reads the pooled [1,1,1,C] itself
    max-as-pool         REDUCE_MAX over H and W (GlobalMaxPooling2D) as MAX_POOL_2D, likewise
    identity-reshape    a RESHAPE to the shape its input has (a Flatten after a global pool) left out
    flatten-into-dense  the flattening RESHAPE before a FULLY_CONNECTED taken out: the dense layer reads the
                        map itself (FULLY_CONNECTED flattens its input, keep_num_dims false), as a convolution
                        over the whole map where the map is not already one row (Core ML's dense layer takes
                        single-row inputs only); RESHAPE is Core ML 2's only
    implicit-broadcast  a BROADCAST_TO whose readers broadcast by themselves (or that changes nothing) left out
    class-token         a CONCATENATION with a 3-D constant (a ViT's class token) written in 4-D: the GPU builds
                        constant inputs of a concatenation as 4-D tensors only
    ids-wrap            an embedding lookup's negative-index wrap, SELECT(ids < 0, ids + rows, ids), taken out
                        where the ids are declared non-negative (the source's id bounds, or the option
                        non-negative-ids)
    float-mask          (option) an integer mask input taken as float32, so its CAST to bool runs on the GPU:
                        it changes what the model takes, so it is never applied unless named
    bool-late           a CAST to bool read by a RESHAPE moved after it: the GPU reshapes float tensors only
    prelu-as-relu       PRELU as RELU(x) + (-alpha) * RELU(-x), bit for bit: Core ML has no PRELU
    channel-pad         a PAD of zero channels (a BlazeFace residual) as a CONCATENATION with zeros that a 1x1
                        convolution of zero weights makes from the input: Core ML pads H and W only

A rewrite runs only on a node a delegate refuses (`optimize.transforms.tflite.fit` asks the rules which), and
the fit keeps it only when the delegate took more and the outputs stayed the same. Rules read; rewrites write.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from optimize.core.vocab import FitOption
from optimize.models.normalize import _schema
from optimize.transforms.tflite.fit_edit import FLOAT32, INT32, Edit

#: Options: rewrites that change what the model takes or what it may be given, applied only when named.
NON_NEGATIVE_IDS = FitOption.NON_NEGATIVE_IDS.value
FLOAT_MASK = FitOption.FLOAT_MASK.value


@dataclass(frozen=True)
class Facts:
    """What rewrites may rely on beyond the graph: the inputs whose ids the model declares non-negative (its
    source's id bounds) and the options the user named."""

    non_negative: frozenset[str] = frozenset()
    options: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Rewrite:
    """One registered rewrite: the refused ops it applies to, its precondition and its edit."""

    name: str
    ops: frozenset[str]
    when: Callable[[Edit, int, Facts], bool]
    apply: Callable[[Edit, int, Facts], str]  # edits in place, returns what it did in a few words
    summary: str
    option: str | None = None  # the option that must be named for it to run (None: always offered)
    order: int = field(default=0, compare=False)


REWRITES: dict[str, Rewrite] = {}


def rewrite(name: str, ops, when, option: str | None = None):
    """Register a rewrite of the nodes `ops` where `when(edit, k, facts)` holds."""

    def register(fn):
        summary = (fn.__doc__ or name).strip().splitlines()[0]
        REWRITES[name] = Rewrite(name, frozenset(ops), when, fn, summary, option, len(REWRITES))
        return fn

    return register


def offered(facts: Facts) -> list[Rewrite]:
    """The rewrites to try, in order: every default one, and the options named."""
    return [r for r in REWRITES.values() if r.option is None or r.option in facts.options]


def _float(e: Edit, t: int) -> bool:
    return t >= 0 and e.dtype(t) == FLOAT32


def _keeps_edges(e: Edit, k: int) -> bool:
    """Op k's inputs are not graph outputs (rewiring never moves the model's edges)."""
    return not e.is_output(e.out(k))


# ------------------------------------------------------------------------------------------ batch-axis
BROADCASTING = ("ADD", "MUL")


def _lower_rank(e: Edit, k: int, _f: Facts) -> bool:
    ins = e.ins(k)
    if len(ins) != 2 or min(ins) < 0 or not all(_float(e, t) for t in ins):
        return False
    a, b = (len(e.shape(t)) for t in ins)
    return a != b and min(a, b) >= 1 and max(a, b) <= 4


@rewrite("batch-axis", BROADCASTING, _lower_rank)
def batch_axis(e: Edit, k: int, _f: Facts) -> str:
    """The lower-rank operand of a broadcasting ADD/MUL given its leading axes, so both ranks are equal."""
    ins = e.ins(k)
    slot = 0 if len(e.shape(ins[0])) < len(e.shape(ins[1])) else 1
    t, rank = ins[slot], len(e.shape(ins[1 - slot]))
    shape = (1,) * (rank - len(e.shape(t))) + e.shape(t)
    if e.is_const(t):
        e.set_input(k, slot, e.seen_as(t, shape, "batched"))
        return f"constant {list(e.shape(t))} read as {list(shape)}"
    reshaped = e.reshape(k, t, shape, "batched")  # put before op k, which moves to k + 1
    e.set_input(k + 1, slot, reshaped)
    return f"operand {list(e.shape(t))} reshaped to {list(shape)}"


# ------------------------------------------------------------------------------------------ mean-as-pool
def _spatial(e: Edit, k: int, _f: Facts) -> bool:
    """A MEAN or REDUCE_MAX over H and W of a float NHWC tensor (axes 1 and 2, constant)."""
    ins = e.ins(k)
    if len(ins) != 2 or not _float(e, ins[0]) or len(e.shape(ins[0])) != 4:
        return False
    axes = e.const(ins[1])
    return axes is not None and sorted({int(a) % 4 for a in axes.reshape(-1)}) == [1, 2] and axes.size == 2


def _dense_readers(e: Edit, t: int) -> list[int]:
    """The readers of `t` that are FULLY_CONNECTED layers reading it as their input (they flatten it)."""
    return [r for r in e.readers(t) if e.name(r) == "FULLY_CONNECTED" and e.ins(r)[0] == t]


def _flat_for_dense(e: Edit, k: int) -> bool:
    """A dense reader with keep_num_dims false flattens its input itself: it can read op k's map directly."""
    opts = e.options(k)
    return opts is not None and not getattr(opts, "keepNumDims", False)


#: Ops that compute each row by itself: they take a row as [B,1,1,C] as well as [B,C], and give it back so.
ROW_WISE = frozenset(
    {"RELU", "RELU6", "RELU_N1_TO_1", "TANH", "LOGISTIC", "HARD_SWISH", "GELU", "LEAKY_RELU", "SOFTMAX", "ADD", "MUL",
     "SUB", "MAXIMUM", "MINIMUM"}
)  # fmt: skip
#: How many row-wise ops a 4-D row is carried through before it is written back to [B, C].
ROW_DEPTH = 8


def _row_wise(e: Edit, r: int, flat: int) -> bool:
    """Reader r computes each row of `flat` ([B, C]) by itself, with nothing wider than a row beside it."""
    return (
        e.name(r) in ROW_WISE
        and e.shape(e.out(r)) == e.shape(flat)
        and all(len(e.shape(i)) <= 2 for i in e.ins(r) if i >= 0)
        and _float(e, e.out(r))
    )


def _feed(e: Edit, flat: int, t: int, depth: int = 0) -> None:
    """Readers of `flat` ([B, C]) read the 4-D `t` ([B,1,1,C]) instead: dense layers directly (they flatten it),
    row-wise ops too (their own result then carried on as [B,1,1,C']), and the rest and a graph output through
    a RESHAPE back to `flat`, written right after the op that makes `t`."""
    for r in _dense_readers(e, flat):
        if _flat_for_dense(e, r):
            e.set_input(r, 0, t)
    while depth < ROW_DEPTH:
        r = next((r for r in e.readers(flat) if _row_wise(e, r, flat)), None)
        if r is None:
            break
        y = e.out(r)
        row = e.tensor(y, (*e.shape(t)[:3], e.shape(y)[-1]), "row")
        e.op(r).inputs = np.array([t if i == flat else i for i in e.ins(r)], np.int32)
        e.op(r).outputs = np.array([row], np.int32)
        _feed(e, y, row, depth + 1)
    if e.is_output(flat) or e.readers(flat):
        e.reshape(e.producer(t) + 1, t, e.shape(flat), "flat", out=flat)


def _as_pool(e: Edit, k: int, pool: str) -> str:
    """Op k (a reduction over H and W) as `pool` over the whole map (VALID, stride 1); without keep_dims its
    readers get the [B,1,1,C] result as `_feed` gives it."""
    s = _schema()
    x, y = e.ins(k)[0], e.out(k)
    b, h, w, c = e.shape(x)
    keep = bool(getattr(e.options(k), "keepDims", False))
    opts = s.Pool2DOptionsT()
    opts.padding, opts.strideW, opts.strideH, opts.filterWidth, opts.filterHeight = s.Padding.VALID, 1, 1, w, h
    pooled = y if keep else e.tensor(y, (b, 1, 1, c), "pooled")
    e.retype(k, pool, s.BuiltinOptions.Pool2DOptions, opts)
    e.op(k).inputs, e.op(k).outputs = np.array([x], np.int32), np.array([pooled], np.int32)
    if not keep:
        _feed(e, y, pooled)
    return f"{h}x{w} {pool.split('_')[0].lower()} pool"


@rewrite("mean-as-pool", ("MEAN",), _spatial)
def mean_as_pool(e: Edit, k: int, _f: Facts) -> str:
    """MEAN over H and W of an NHWC tensor as AVERAGE_POOL_2D over the whole map (VALID, stride 1)."""
    return _as_pool(e, k, "AVERAGE_POOL_2D")


@rewrite("max-as-pool", ("REDUCE_MAX",), _spatial)
def max_as_pool(e: Edit, k: int, _f: Facts) -> str:
    """REDUCE_MAX over H and W of an NHWC tensor (GlobalMaxPooling2D) as MAX_POOL_2D over the whole map."""
    return _as_pool(e, k, "MAX_POOL_2D")


# ------------------------------------------------------------------------------------------ identity-reshape
def _changes_nothing(e: Edit, k: int, _f: Facts) -> bool:
    x, y = e.ins(k)[0], e.out(k)
    return e.shape(x) == e.shape(y) and not e.is_output(y) and not e.is_output(x) and bool(e.readers(y))


@rewrite("identity-reshape", ("RESHAPE",), _changes_nothing)
def identity_reshape(e: Edit, k: int, _f: Facts) -> str:
    """A RESHAPE to the shape its input has already (a Flatten after a global pool) left out."""
    x, y = e.ins(k)[0], e.out(k)
    e.redirect(y, x, skip=k)
    e.remove(k)
    return f"reshape of {list(e.shape(x))} to itself left out"


# ------------------------------------------------------------------------------------------ flatten-into-dense
def _dense_weights(e: Edit, r: int, n: int) -> bool:
    w = e.ins(r)[1] if len(e.ins(r)) > 1 else -1
    opts = e.options(r)
    fmt = getattr(opts, "weightsFormat", 0) if opts is not None else 0
    return w >= 0 and _float(e, w) and e.is_const(w) and e.shape(w)[-1:] == (n,) and not fmt


def _flattens(e: Edit, k: int, _f: Facts) -> bool:
    """A RESHAPE of [B, ...] to [B, N] read only by dense layers (as their input), not a graph output."""
    x, y = e.ins(k)[0], e.out(k)
    xs, ys = e.shape(x), e.shape(y)
    if len(xs) < 3 or len(ys) != 2 or xs[0] != ys[0] or int(np.prod(xs[1:])) != ys[1] or not _float(e, x):
        return False
    readers = e.readers(y)
    if not readers or e.is_output(y) or readers != _dense_readers(e, y):
        return False
    one_row = all(d == 1 for d in xs[1:-1])
    return all(_dense_weights(e, r, ys[1]) for r in readers) and (one_row or (len(xs) == 4 and xs[0] == 1))


def _as_convolution(e: Edit, r: int, x: int) -> None:
    """Dense layer r over the [1,H,W,C] map x as one CONV_2D with an HxW kernel: the same weights, read as
    [units,H,W,C] (the flattening order), giving [1,1,1,units]."""
    s = _schema()
    _, h, w, c = e.shape(x)
    ins, y = e.ins(r), e.out(r)
    units = e.shape(ins[1])[0]
    kernel = e.seen_as(ins[1], (units, h, w, c), "kernel")
    bias = ins[2] if len(ins) > 2 and ins[2] >= 0 else -1
    if bias < 0:  # Core ML takes a convolution with a bias only: a zero one adds nothing
        bias = e.constant(f"{e.tensor_name(y)}/bias", np.zeros(units, np.float32), FLOAT32)
    opts = s.Conv2DOptionsT()
    opts.padding, opts.strideW, opts.strideH = s.Padding.VALID, 1, 1
    opts.fusedActivationFunction = getattr(e.options(r), "fusedActivationFunction", 0) or 0
    mapped = e.tensor(y, (1, 1, 1, units), "map")
    e.retype(r, "CONV_2D", s.BuiltinOptions.Conv2DOptions, opts)
    e.op(r).inputs, e.op(r).outputs = np.array([x, kernel, bias], np.int32), np.array([mapped], np.int32)
    _feed(e, y, mapped)


@rewrite("flatten-into-dense", ("RESHAPE",), _flattens)
def flatten_into_dense(e: Edit, k: int, _f: Facts) -> str:
    """The flattening RESHAPE before dense layers taken out: each reads the map itself (as a convolution over
    the whole map where the map is more than one row)."""
    x, y = e.ins(k)[0], e.out(k)
    xs = e.shape(x)
    readers = e.readers(y)
    if all(d == 1 for d in xs[1:-1]):
        for r in readers:
            e.set_input(r, 0, x)
            e.options(r).keepNumDims = False
        how = "dense layer reads it"
    else:
        for r in sorted(readers, reverse=True):
            _as_convolution(e, r, x)
        how = f"dense layer as a {xs[1]}x{xs[2]} convolution"
    e.remove(k)
    return f"flatten of {list(xs)} taken out; the {how}"


# ------------------------------------------------------------------------------------------ implicit-broadcast
SELF_BROADCASTING = ("ADD", "MUL", "SUB", "DIV", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE", "SELECT_V2")


def _reader_shape_kept(e: Edit, r: int, t: int, src: int) -> bool:
    """Reader r gives the same output shape when it reads `src` in place of `t` (it broadcasts itself)."""
    if e.name(r) not in SELF_BROADCASTING:
        return False
    shapes = [e.shape(src if i == t else i) for i in e.ins(r)]
    try:
        return tuple(np.broadcast_shapes(*shapes)) == e.shape(e.out(r))
    except ValueError:
        return False


#: A broadcast constant is stored broadcast up to this many elements (an attention mask of 512 x 512 fits).
FOLD_ELEMENTS = 1 << 20


def _needless_broadcast(e: Edit, k: int, _f: Facts) -> bool:
    x, y = e.ins(k)[0], e.out(k)
    if e.is_output(y) or not e.readers(y):
        return False
    if e.is_const(x) and e.const(x) is not None and int(np.prod(e.shape(y))) <= FOLD_ELEMENTS:
        return True
    return e.shape(x) == e.shape(y) or all(_reader_shape_kept(e, r, y, x) for r in e.readers(y))


@rewrite("implicit-broadcast", ("BROADCAST_TO",), _needless_broadcast)
def implicit_broadcast(e: Edit, k: int, _f: Facts) -> str:
    """A BROADCAST_TO left out where it changes nothing or its readers broadcast by themselves, or stored
    broadcast where it broadcasts a constant."""
    x, y = e.ins(k)[0], e.out(k)
    value = e.const(x) if e.is_const(x) else None
    if value is not None and e.shape(x) != e.shape(y):
        e.redirect(y, e.constant(f"{e.tensor_name(y)}/folded", np.broadcast_to(value, e.shape(y)).copy(), e.dtype(x)))
        e.remove(k)
        return f"constant broadcast to {list(e.shape(y))} stored as such"
    e.redirect(y, x, skip=k)
    e.remove(k)
    return f"broadcast of {list(e.shape(x))} to {list(e.shape(y))} left to its readers"


# ------------------------------------------------------------------------------------------ class-token
def _to_4d(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A rank-2 or rank-3 shape as the GPU reads it (BC -> B11C, BWC -> B1WC)."""
    return (shape[0], 1, 1, shape[1]) if len(shape) == 2 else (shape[0], 1, shape[1], shape[2])


def _low_rank_constant(e: Edit, k: int, _f: Facts) -> bool:
    ins = [t for t in e.ins(k) if t >= 0]
    ranks = {len(e.shape(t)) for t in ins}
    return (
        len(ins) > 1
        and ranks in ({2}, {3})
        and all(_float(e, t) for t in ins)
        and any(e.is_const(t) for t in ins)
        and len(e.shape(e.out(k))) in (2, 3)
    )


@rewrite("class-token", ("CONCATENATION",), _low_rank_constant)
def class_token(e: Edit, k: int, _f: Facts) -> str:
    """A CONCATENATION of 2-D or 3-D tensors with a constant (a ViT's class token) computed in 4-D."""
    ins, y = e.ins(k), e.out(k)
    rank = len(e.shape(y))
    axis = int(getattr(e.options(k), "axis", 0)) % rank
    four = []
    for t in ins:
        if e.is_const(t):
            four.append(e.seen_as(t, _to_4d(e.shape(t)), "4d"))
        else:
            four.append(e.reshape(k, t, _to_4d(e.shape(t)), "4d"))
            k += 1
    mapped = e.tensor(y, _to_4d(e.shape(y)), "4d")
    e.op(k).inputs, e.op(k).outputs = np.array(four, np.int32), np.array([mapped], np.int32)
    e.options(k).axis = axis if axis == 0 else axis + (2 if rank == 2 else 1)
    e.reshape(k + 1, mapped, e.shape(y), "3d", out=y)
    return f"concatenation of {len(ins)} {rank}-D tensors computed in 4-D"


# ------------------------------------------------------------------------------------------ ids-wrap
WRAP_OPS = ("LESS", "SELECT", "SELECT_V2", "ADD")
ID_KEEPERS = ("CAST", "RESHAPE", "SQUEEZE", "EXPAND_DIMS", "STRIDED_SLICE", "SLICE", "TRANSPOSE", "IDENTITY")


SELECTS = ("SELECT", "SELECT_V2")


def _select_of(e: Edit, k: int) -> int | None:
    """Op k if it is a SELECT, else the SELECT reading it."""
    if e.name(k) in SELECTS:
        return k
    return next((r for r in e.readers(e.out(k)) if e.name(r) in SELECTS), None)


def _wrap_select(e: Edit, k: int) -> int | None:
    """The SELECT of the negative-index wrap SELECT(ids < 0, ids + rows, ids) that op k is part of."""
    sel = _select_of(e, k)
    if sel is None or len(e.ins(sel)) != 3:
        return None
    cond, plus, ids = e.ins(sel)
    less, add = e.producer(cond), e.producer(plus)
    if less is None or add is None or e.name(less) != "LESS" or e.name(add) != "ADD":
        return None
    zero = e.const(e.ins(less)[1])
    ok = e.ins(less)[0] == ids and ids in e.ins(add) and zero is not None and not np.any(zero)
    return sel if ok else None


def _input_of(e: Edit, t: int) -> str | None:
    """The model input whose values reach `t` unchanged (through casts, reshapes, slices), by its signature
    name (its tensor's name when the model has no signature)."""
    for _ in range(32):
        if t in [int(i) for i in e.sg.inputs]:
            return e.input_name(t)
        p = e.producer(t)
        if p is None or e.name(p) not in ID_KEEPERS:
            return None
        t = e.ins(p)[0]
    return None


def _declared_non_negative(e: Edit, k: int, f: Facts) -> bool:
    sel = _wrap_select(e, k)
    if sel is None:
        return False
    if NON_NEGATIVE_IDS in f.options:
        return True
    return _input_of(e, e.ins(sel)[2]) in f.non_negative


@rewrite("ids-wrap", WRAP_OPS, _declared_non_negative)
def ids_wrap(e: Edit, k: int, _f: Facts) -> str:
    """An embedding lookup's negative-index wrap taken out where the ids are never negative."""
    sel = _wrap_select(e, k)
    cond, plus, ids = e.ins(sel)
    if e.is_output(e.out(sel)):
        raise ValueError("the wrap's output is a model output")
    e.redirect(e.out(sel), ids, skip=sel)
    e.remove(sel)
    for t in (cond, plus):  # the comparison and the addition, when nothing else reads them
        p = e.producer(t)
        if p is not None and not e.readers(t) and not e.is_output(t):
            e.remove(p)
    return "negative-index wrap of the ids taken out"


# ------------------------------------------------------------------------------------------ float-mask
def _integer_mask_input(e: Edit, k: int, f: Facts) -> bool:
    x, y = e.ins(k)[0], e.out(k)
    inputs = [int(i) for i in e.sg.inputs]
    return FLOAT_MASK in f.options and x in inputs and e.dtype(x) in (INT32, 4) and e.dtype(y) == 6


@rewrite("float-mask", ("CAST",), _integer_mask_input, option=FLOAT_MASK)
def float_mask(e: Edit, k: int, _f: Facts) -> str:
    """(option) An integer mask input taken as float32 (0/1), so its CAST to bool runs on the GPU."""
    x = e.ins(k)[0]
    e.sg.tensors[x].type = FLOAT32
    return f"input {e.tensor_name(x)} taken as float32 (it was an integer mask)"


# ------------------------------------------------------------------------------------------ bool-late
SHAPE_ONLY = ("RESHAPE", "EXPAND_DIMS", "SQUEEZE")


def _reshaped_bool(e: Edit, k: int, _f: Facts) -> bool:
    """A shape-only op on a bool tensor that a CAST from float32 wrote for it alone."""
    x = e.ins(k)[0]
    cast = e.producer(x)
    return (
        cast is not None
        and e.name(cast) == "CAST"
        and e.dtype(x) == 6
        and _float(e, e.ins(cast)[0])
        and e.readers(x) == [k]
        and not e.is_output(x)
    )


@rewrite("bool-late", SHAPE_ONLY, _reshaped_bool)
def bool_late(e: Edit, k: int, _f: Facts) -> str:
    """A CAST to bool moved after the RESHAPE that reads it: the float tensor is reshaped, then cast."""
    x, y = e.ins(k)[0], e.out(k)
    cast = e.producer(x)
    src = e.ins(cast)[0]
    floats = e.tensor(y, e.shape(y), "float", dtype=FLOAT32)
    e.op(k).inputs = np.array([src, *e.ins(k)[1:]], np.int32)
    e.op(k).outputs = np.array([floats], np.int32)
    e.op(cast).inputs, e.op(cast).outputs = np.array([floats], np.int32), np.array([y], np.int32)
    name = e.name(k)
    e.sg.operators.insert(k, e.sg.operators.pop(cast))  # the cast now reads the reshape: it runs right after it
    return f"CAST to bool moved after the {name}"


# ------------------------------------------------------------------------------------------ prelu-as-relu
def _prelu(e: Edit, k: int, _f: Facts) -> bool:
    x, alpha = e.ins(k)[:2]
    return _float(e, x) and _float(e, alpha) and e.const(alpha) is not None and len(e.shape(x)) <= 4


@rewrite("prelu-as-relu", ("PRELU",), _prelu)
def prelu_as_relu(e: Edit, k: int, _f: Facts) -> str:
    """PRELU as RELU(x) + (-alpha) * RELU(-x): exact (every product is by a sign or by zero, or alpha * x)."""
    s = _schema()
    x, alpha = e.ins(k)[:2]
    y = e.out(k)
    minus_one = e.constant(f"{e.tensor_name(y)}/minus_one", np.array([-1.0], np.float32), FLOAT32)
    minus_alpha = e.constant(f"{e.tensor_name(y)}/minus_alpha", -e.const(alpha), FLOAT32)
    neg, pos, low, slope = (e.tensor(y, e.shape(y), n) for n in ("negated", "positive", "negative", "slope"))
    mul, add = (s.BuiltinOptions.MulOptions, s.MulOptionsT()), (s.BuiltinOptions.AddOptions, s.AddOptionsT())
    e.remove(k)
    for at, op in enumerate(
        [
            ("RELU", [x], [pos], None, None),
            ("MUL", [x, minus_one], [neg], *mul),
            ("RELU", [neg], [low], None, None),
            ("MUL", [low, minus_alpha], [slope], *mul),
            ("ADD", [pos, slope], [y], *add),
        ]
    ):
        e.insert(k + at, *op)
    return "PRELU as RELU, MUL and ADD"


# ------------------------------------------------------------------------------------------ channel-pad
def _channel_pad(e: Edit, k: int, _f: Facts) -> bool:
    """A PAD (zeros) of a float NHWC tensor on its channels only."""
    ins = e.ins(k)
    p = e.const(ins[1]) if len(ins) == 2 else None
    if p is None or p.shape != (4, 2) or not _float(e, ins[0]) or len(e.shape(ins[0])) != 4:
        return False
    return not p[:3].any() and p[3].sum() > 0 and (p >= 0).all()


@rewrite("channel-pad", ("PAD",), _channel_pad)
def channel_pad(e: Edit, k: int, _f: Facts) -> str:
    """A PAD of zero channels as a CONCATENATION with zeros made from the input by a 1x1 convolution of zero
    weights (+0 from finite inputs, as PAD writes)."""
    s = _schema()
    x, y = e.ins(k)[0], e.out(k)
    before, after = (int(v) for v in e.const(e.ins(k)[1])[3])
    b, h, w, c = e.shape(x)
    parts = [x]
    for n, where in ((before, 0), (after, len(parts) + 1)):
        if n:
            zeros = e.tensor(y, (b, h, w, n), f"zeros{where}")
            kernel = e.constant(f"{e.tensor_name(y)}/zero_kernel{where}", np.zeros((n, 1, 1, c), np.float32), FLOAT32)
            bias = e.constant(f"{e.tensor_name(y)}/zero_bias{where}", np.zeros(n, np.float32), FLOAT32)
            opts = s.Conv2DOptionsT()
            opts.padding, opts.strideW, opts.strideH = s.Padding.VALID, 1, 1
            e.insert(k, "CONV_2D", [x, kernel, bias], [zeros], s.BuiltinOptions.Conv2DOptions, opts)
            k += 1
            parts.insert(where, zeros)
    opts = s.ConcatenationOptionsT()
    opts.axis = 3
    e.remove(k)
    e.insert(k, "CONCATENATION", parts, [y], s.BuiltinOptions.ConcatenationOptions, opts)
    return f"{before}+{after} zero channels concatenated"
