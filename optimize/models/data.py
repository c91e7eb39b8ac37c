"""Datasets: `.npz` files checked against the model's inputs before any work starts; calibration samples.

An `.npz` (numpy.savez) holds, for a model with one input:
    x and y (split 80/20 into train and test), or x_train / y_train / x_test / y_test, optionally x_cal;
for a model with several inputs, one array per input, keyed by the model's input name:
    x:image and x:features (or x_train:image, x_test:image, x_cal:image, ...);
and labels per output when there are several: y:<output name> (plain `y` belongs to the first output, or
to the one named by --label-output). Labels are optional: without them accuracy is not measured, but
calibration and fidelity still work. Every array is checked on load: finite values, one sample per row,
the same sample count across inputs, and a header that does not lie about its size.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from optimize.core.errors import DataError
from optimize.core.paths import regular_file
from optimize.core.results import Split, TestSample
from optimize.core.shown import named

log = logging.getLogger(__name__)

SPLITS = ("x", "y", "x_train", "y_train", "x_test", "y_test", "x_cal")
KNOWN_KEYS = SPLITS  # the plain names; `<split>:<name>` adds an input or output name
#: The optional array of class names, one per class id (text): written into every shipped .tflite's metadata.
LABELS = "labels"
MAX_LABEL_CHARS = 200
MAX_ARRAY_BYTES = 8 * 2**30  # one array above this is refused before it is read
#: What zipfile and numpy raise on a corrupt archive or .npy (NotImplementedError: an unknown zip version
#: or compression; RuntimeError: an encrypted member).
_UNREADABLE = (ValueError, OSError, EOFError, zipfile.BadZipFile, NotImplementedError, RuntimeError)

#: One input's samples, or several inputs' keyed by name (first axis: samples).
Inputs = np.ndarray | dict[str, np.ndarray]
#: Labels for the first output, or several outputs' keyed by name.
Labels = np.ndarray | dict[str, np.ndarray]


def count(x: Inputs) -> int:
    return len(next(iter(x.values()))) if isinstance(x, dict) else len(x)


def take(x: Inputs, idx) -> Inputs:
    """A subset of samples (a slice or index array), for every input alike."""
    return {k: v[idx] for k, v in x.items()} if isinstance(x, dict) else x[idx]


def as_float(x: Inputs) -> Inputs:
    return (
        {k: v.astype(np.float32, copy=False) for k, v in x.items()}
        if isinstance(x, dict)
        else x.astype(np.float32, copy=False)
    )


def _as_input(v: np.ndarray) -> np.ndarray:
    return v if np.issubdtype(v.dtype, np.integer) else v.astype(np.float32, copy=False)


def as_inputs(x: Inputs) -> Inputs:
    """Samples as a model takes them: floats as float32, integers (token ids, masks, user ids) kept integer,
    so an Embedding, a GATHER or a torch embedding gets the ids it indexes with. Whoever feeds a tensor of
    another integer width casts to it (the runtime, the converter's representative dataset, PT2E)."""
    return {k: _as_input(v) for k, v in x.items()} if isinstance(x, dict) else _as_input(x)


@dataclass(frozen=True)
class Dataset:
    """Train (for fine-tuning), calibration (for int8 ranges) and test (for accuracy, fidelity) splits."""

    x_train: Inputs | None
    y_train: Labels | None
    x_cal: Inputs
    x_test: Inputs
    y_test: Labels | None
    source: str
    calibration_seed: int = 0
    task: str | None = None  # --task: what the labels are (None: detected from the output and labels)
    label_output: str | None = None  # --label-output: which output the labels belong to (None: the first)
    outputs: tuple[str, ...] = ()  # the source model's output names, in order (to find label_output)
    split: Split | None = None  # how train and test were split, and what the test split holds
    class_names: tuple[str, ...] = ()  # the file's `labels`: class names by class id (the .tflite's labels.txt)

    @functools.cached_property
    def fingerprint(self) -> str:
        """Content hash of every array: the cache key part that says 'same data'. Computed once per Dataset (a
        frozen one: `dataclasses.replace` makes a new one) and carried with it to workers: hashing MobileNetV2's
        100 calibration images took 0.1 s, and a sweep's tasks asked for it dozens of times."""
        h = hashlib.sha256()
        for a in (self.x_train, self.y_train, self.x_cal, self.x_test, self.y_test):
            for name, arr in (sorted(a.items()) if isinstance(a, dict) else [("", a)]) if a is not None else []:
                h.update(name.encode() + str(arr.shape).encode() + str(arr.dtype).encode())
                h.update(np.ascontiguousarray(arr).tobytes())
        h.update(f"{self.calibration_seed}|{self.task}|{self.label_output}".encode())
        if self.class_names:  # they are written into every candidate's file
            h.update("\n".join(self.class_names).encode())
        return h.hexdigest()[:16]

    @property
    def input_names(self) -> list[str] | None:
        """The input names the data is keyed by, or None for a single unnamed input."""
        return list(self.x_cal) if isinstance(self.x_cal, dict) else None

    @property
    def sample_shape(self) -> tuple[int, ...]:
        x = self.x_cal
        return tuple(next(iter(x.values())).shape[1:]) if isinstance(x, dict) else tuple(x.shape[1:])

    def calibration_index(self, n: int) -> np.ndarray:
        """Which n calibration samples are used: drawn at random (seeded) across the calibration split.

        Not the first n in file order: a file sorted by class or by time would calibrate on one corner.
        """
        total = count(self.x_cal)
        if n >= total:
            return np.arange(total)
        return np.sort(np.random.default_rng(self.calibration_seed).choice(total, n, replace=False))

    def calibration(self, n: int) -> Inputs:
        """The n calibration samples (`calibration_index`): floats as float32, integer inputs integer (`as_inputs`)."""
        return as_inputs(take(self.x_cal, self.calibration_index(n)))

    def require_training(self, technique: str) -> None:
        """Fine-tuning needs training inputs; labels are optional (outputs without them learn the float model's)."""
        if self.x_train is None:
            raise DataError(
                f"{technique} fine-tunes the model and needs training inputs.",
                "Pass an .npz with x (and y) or x_train (and y_train).",
            )

    def labels(self, split: str, output: str | None) -> np.ndarray | None:
        """The labels of `split` ("train"/"test") for one output (None: the first, or the only one)."""
        y = self.y_train if split == "train" else self.y_test
        if not isinstance(y, dict):
            return y
        if output is not None and output in y:
            return y[output]
        return None if output is not None else next(iter(y.values()))

    def check_input(self, shape: tuple, dtype: str = "float32", name: str = "input") -> None:
        """Raise one clear DataError when samples of any split do not fit one model input (batch dim
        ignored): shape, a numeric type, and values the input's type can hold (float64 1e300 is infinite
        as float32)."""
        splits = [("x_cal", self.x_cal), ("x_train", self.x_train), ("x_test", self.x_test)]
        for split, x in splits:
            if x is None:
                continue
            if isinstance(x, dict):
                if name not in x:
                    raise DataError(
                        f"{self.source} has no array for the model's input {named(name)} (it has {', '.join(map(named, x))}).",
                        f"Add x:{named(name)} (and x_train:{named(name)}/x_test:{named(name)} if you split).",
                    )
                x = x[name]
            _check_shape(x, shape, name)
            _check_range(
                x, dtype, f"{self.source}: {split}" + (f":{named(name)}" if isinstance(self.x_cal, dict) else "")
            )


def _check_shape(x: np.ndarray, shape: tuple, name: str) -> None:
    want = tuple(int(d) if d is not None and d != -1 else -1 for d in shape[1:])
    got = tuple(x.shape[1:])
    if len(want) != len(got) or any(w not in (-1, g) for w, g in zip(want, got)):
        raise DataError(
            f"Data samples have shape {list(got)} but the model's {named(name)} takes {list(want)} (batch excluded).",
            "Reshape the arrays in the .npz to match the model input.",
        )
    if not np.issubdtype(x.dtype, np.number) or x.dtype == np.bool_:
        raise DataError(f"Data for {named(name)} has dtype {x.dtype}; the model takes numbers.", "Store x as float32.")


def _check_range(x: np.ndarray, dtype: str, what: str) -> None:
    """Values the model's input type holds: no float beyond its range (it would become inf), no integer
    outside an integer input's range (it would wrap)."""
    try:
        target = np.dtype(dtype)
    except TypeError:
        return
    if x.size == 0 or x.dtype == target:
        return
    if np.issubdtype(target, np.floating) and np.issubdtype(x.dtype, np.floating):
        top = float(np.max(np.abs(x)))
        if top > float(np.finfo(target).max):
            raise DataError(
                f"{what} holds values up to {top:.3g}, beyond {target.name} (the model's input type): "
                "they would become infinite.",
                "Scale or clip the data to the range the model was trained on.",
            )
    elif np.issubdtype(target, np.integer) and np.issubdtype(x.dtype, np.number):
        if np.issubdtype(x.dtype, np.floating):
            _check_whole(x, target, what)
        info = np.iinfo(target)
        lo, hi = float(np.min(x)), float(np.max(x))
        if lo < info.min or hi > info.max:
            raise DataError(
                f"{what} holds values {lo:g}..{hi:g}, outside {target.name} (the model's input type).",
                f"Store values within {info.min}..{info.max}.",
            )


def _check_whole(x: np.ndarray, target: np.dtype, what: str) -> None:
    """Floats fed to an integer input (token ids, user ids) must be whole numbers: 3.7 is no id."""
    frac = np.flatnonzero(x.reshape(-1) != np.round(x.reshape(-1)))
    if frac.size:
        v = x.reshape(-1)[frac[0]]
        raise DataError(
            f"{what} holds {v:g}, not a whole number ({frac.size} value(s) with a fraction); the model's input "
            f"takes {target.name} ids.",
            f"Store the ids as integers ({target.name}).",
        )


def _splits(ds: Dataset) -> list[tuple[str, str, Inputs]]:
    """(split, what the file calls it, its inputs) of every split that has any: a split cut from x is x."""
    cut = ds.split is not None and ds.split.method != "given"
    out = []
    for k, v in (("x_cal", ds.x_cal), ("x_train", ds.x_train), ("x_test", ds.x_test)):
        if v is not None:
            out.append((k, "x" if cut and (k != "x_cal" or v is ds.x_train or v is ds.x_test) else k, v))
    return out


def _input_array(x: Inputs, name: str, single: bool) -> np.ndarray | None:
    if isinstance(x, dict):
        return x.get(name)
    return x if single else None


def integer_ids(ds: Dataset, types: dict[str, str], single: bool | None = None) -> tuple[Dataset, list[str]]:
    """Ids stored as floats for inputs that take integers (`types`: input name -> dtype, the model's; `single`:
    the model has one input, so an unnamed array is its): whole numbers are cast to the input's type, exactly
    (said in the notes returned); any other value is refused in one line, as are values the type cannot hold.
    Every other array is left as it is."""
    ints = {n: np.dtype(t) for n, t in types.items() if _is_int(t)}
    single = len(types) == 1 if single is None else single
    cast: dict[int, np.ndarray] = {}  # by id(): x_cal is often x_train itself, cast once
    notes: list[str] = []

    def fit(x: Inputs, split: str) -> Inputs:
        if id(x) in cast:  # x_cal is x_train itself: one cast, the identity kept
            return cast[id(x)]
        cast[id(x)] = fitted = _fit(x, split)
        return fitted

    def _fit(x: Inputs, split: str) -> Inputs:
        names = list(x) if isinstance(x, dict) else list(ints) if single else []
        out = dict(x) if isinstance(x, dict) else None
        for name in names:
            a = _input_array(x, name, single)
            if name not in ints or a is None or not np.issubdtype(a.dtype, np.floating) or a.size == 0:
                continue
            if id(a) not in cast:
                where = f"{ds.source}: {split}" + (f":{named(name)}" if isinstance(x, dict) else "")
                _check_range(a, ints[name].name, where)  # whole numbers the type holds, or one line
                cast[id(a)] = a.astype(ints[name])
                notes.append(
                    f"{Path(ds.source).name}: {split}" + (f":{named(name)}" if isinstance(x, dict) else "") + " holds "
                    f"ids stored as {a.dtype}: whole numbers, cast to {ints[name].name} (the model's input "
                    f"{named(name)} takes {ints[name].name})"
                )
            if out is None:
                return cast[id(a)]
            out[name] = cast[id(a)]
        return out if out is not None and any(out[k] is not x[k] for k in out) else x

    if not ints:
        return ds, []
    fitted = {split: fit(x, label) for split, label, x in _splits(ds)}
    return replace(ds, **fitted), list(dict.fromkeys(notes))  # x's train and test parts: one note


def _is_int(dtype: str) -> bool:
    try:
        return np.issubdtype(np.dtype(dtype), np.integer)
    except TypeError:
        return False


def fitted(ds: Dataset, types: dict[str, str], bounds: list, inputs: int) -> Dataset:
    """The data made to fit a model's integer inputs before any work, from what the model says without loading
    it (`types`: input name -> dtype; `bounds`: its id inputs' vocabularies; `inputs`: how many it has): ids
    stored as floats cast when they are whole numbers (said on screen once, `integer_ids`) or refused in one
    line, and ids beyond the vocabulary of the embedding they index refused in one line (`check_ids`)."""
    ds, notes = integer_ids(ds, types)
    say_once(notes)
    check_ids(ds, bounds, inputs)
    return ds


def check_ids(ds: Dataset, bounds: list, inputs: int) -> None:
    """Ids within the vocabulary of the embedding they index (`bounds`: `vocabulary.IdBound`s read from the
    model; `inputs`: how many inputs the model has, so a single unnamed array belongs to its only one): an id
    beyond it, or below 0, fails every run of the float model ("gather index out of bounds"), so it is one
    line now, naming the input and the bound."""
    for b in bounds:
        for _, split, x in _splits(ds):
            a = _input_array(x, b.input, inputs == 1)
            if a is None or a.size == 0 or not np.issubdtype(a.dtype, np.number):
                continue
            lowest = getattr(b, "lowest", 0)
            lo, hi = float(np.min(a)), float(np.max(a))
            if lo >= lowest and hi <= b.size - 1:
                continue
            where = f"{ds.source}: {split}" + (f":{named(b.input)}" if isinstance(x, dict) else "")
            bad = hi if hi > b.size - 1 else lo
            n = int(np.count_nonzero((a < lowest) | (a > b.size - 1)))
            raise DataError(
                f"{where} holds id {bad:g} ({n} id(s) out of range): input {named(b.input)} indexes {b.layer} of "
                f"{b.size} rows, ids {lowest}..{b.size - 1}.",
                "Map ids outside the vocabulary to one the model knows (its out-of-vocabulary id), or pass the "
                "model trained on them.",
            )


def check_inputs(ds: Dataset, specs: list) -> None:
    """The data against every model input (`specs`: name, shape, dtype), one clear line at the first misfit."""
    names = ds.input_names
    if names is None and len(specs) > 1:
        raise DataError(
            f"The model has {len(specs)} inputs ({', '.join(named(s.name) for s in specs)}); the data has one array x.",
            "Key one array per input: x:" + ", x:".join(named(s.name) for s in specs) + " (numpy.savez(..., **{...})).",
        )
    if names is not None:
        extra = sorted(set(names) - {s.name for s in specs})
        if extra:
            raise DataError(
                f"{ds.source} has x:{named(extra[0])}, but the model's inputs are {', '.join(named(s.name) for s in specs)}.",
                "Name each x:<input> after the model's input.",
            )
    for s in specs:
        ds.check_input(s.shape, s.dtype, s.name if names is not None else s.name)


# ---------------------------------------------------------------------------------------------- loading
def _read_member(z: zipfile.ZipFile, info: zipfile.ZipInfo, path: Path) -> np.ndarray:
    """One .npy member, its size and compression ratio checked (a zip bomb is refused before a byte is
    decompressed) and its header against its real size before anything is allocated."""
    from optimize.core.bounded import check_member

    name = info.filename.removesuffix(".npy")
    check_member(info, MAX_ARRAY_BYTES, str(path), DataError)
    try:
        with z.open(info) as f:
            version = np.lib.format.read_magic(f)
            header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = header(f)
    except _UNREADABLE as e:
        raise DataError(
            f"{path}: array {name!r} is not a readable .npy ({e}).", "Save arrays with numpy.savez."
        ) from None
    if dtype.hasobject:
        raise DataError(f"{path}: array {name!r} holds Python objects.", "Store numbers (float32, int64).")
    claimed = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if claimed > max(info.file_size, 0) + 4096 or claimed > MAX_ARRAY_BYTES:
        raise DataError(
            f"{path}: array {name!r} claims {claimed:,} bytes ({shape}) but the file holds {info.file_size:,}.",
            "The .npz is corrupt or forged: save it again with numpy.savez.",
        )
    try:
        with z.open(info) as f:
            return np.lib.format.read_array(f, allow_pickle=False)
    except _UNREADABLE as e:
        raise DataError(
            f"{path}: array {name!r} is not a readable .npy ({e}).", "Save arrays with numpy.savez."
        ) from None


def _read_npz(p: Path) -> dict[str, np.ndarray]:
    regular_file(p, "data", DataError)
    try:
        with zipfile.ZipFile(p) as z:
            return {info.filename.removesuffix(".npy"): _read_member(z, info, p) for info in z.infolist()}
    except _UNREADABLE as e:
        raise DataError(
            f"{p} is not a readable .npz file ({e.__class__.__name__}).", "Save arrays with numpy.savez."
        ) from None


def _group(arrays: dict[str, np.ndarray], p) -> dict[str, Inputs]:
    """`x:image` and `x:features` -> {"x": {"image": ..., "features": ...}}; plain keys stay arrays."""
    out: dict[str, Inputs] = {}
    for key, arr in arrays.items():
        split, _, name = key.partition(":")
        if split not in SPLITS:
            raise DataError(
                f"{p} has unknown array {key!r}.",
                f"Use {', '.join(SPLITS)}, or <split>:<input name> for models with several inputs.",
            )
        if not name:
            if isinstance(out.get(split), dict):
                raise DataError(f"{p} has both {split} and {split}:<name> arrays.", f"Key every {split} by name.")
            out[split] = arr
        else:
            if isinstance(out.get(split), np.ndarray):
                raise DataError(f"{p} has both {split} and {split}:{named(name)}.", f"Key every {split} by name.")
            out.setdefault(split, {})[name] = arr
    return out


def load_data(path: str | Path, calibration_seed: int = 0) -> Dataset:
    """Read an .npz dataset; one clear error for anything that is not one."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"No data file at {p}.", "Pass an .npz with arrays x and y (or x_train/y_train/x_test/y_test).")
    arrays = _read_npz(p)
    names = class_names(arrays.pop(LABELS, None), str(p))
    return from_arrays(source=str(p), calibration_seed=calibration_seed, class_names=names, **_group(arrays, p))


def class_names(a: np.ndarray | None, source: str) -> tuple[str, ...]:
    """The `labels` array as class names: one line of text each, in class id order."""
    if a is None:
        return ()
    if a.ndim != 1 or a.dtype.kind not in "US" or not len(a):
        raise DataError(
            f"{source}: labels must be a 1-D array of class names (text), got {a.dtype} {a.shape}.",
            "Save the class names in class id order: numpy.savez(..., labels=np.array(['cat', 'dog'])).",
        )
    names = tuple(v.decode(errors="replace") if isinstance(v, bytes) else str(v) for v in a.tolist())
    bad = next((n for n in names if "\n" in n or "\r" in n or len(n) > MAX_LABEL_CHARS), None)
    if bad is not None:
        raise DataError(
            f"{source}: a class name is not one short line ({named(bad[:40])}...).",
            f"Give each class name on one line, at most {MAX_LABEL_CHARS} characters.",
        )
    return names


# ---------------------------------------------------------------------------------------------- checking
#: Array kinds that are not real numbers, by numpy's kind code: refused by name.
NOT_NUMBERS = {
    "c": "complex numbers",
    "O": "Python objects",
    "U": "text",
    "S": "bytes",
    "V": "structured records",
    "M": "dates",
    "m": "time spans",
}


def _check_array(a: np.ndarray, what: str, source: str) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype.kind in NOT_NUMBERS:
        raise DataError(
            f"{source}: {what} holds {NOT_NUMBERS[a.dtype.kind]} (dtype {a.dtype}); optimize takes real numbers.",
            "Store floats or integers (labels: integer class ids or real values).",
        )
    if a.ndim == 0:
        raise DataError(f"{source}: {what} is a scalar.", "Give one sample per row (the first axis is the sample).")
    if len(a) == 0:
        raise DataError(f"{source}: {what} has no samples.", f"Give {what} at least one sample, or leave it out.")
    if np.issubdtype(a.dtype, np.floating):
        nan, inf = int(np.isnan(a).sum()), int(np.isinf(a).sum())
        if nan or inf:
            bad = f"{nan} NaN" if nan else f"{inf} infinite"
            raise DataError(f"{source}: {what} contains {bad} values.", "Clean or impute them before optimizing.")
    return a


def _checked(x: Inputs | None, what: str, source: str) -> Inputs | None:
    """Every array of one split checked, and the inputs' sample counts equal."""
    if x is None:
        return None
    if not isinstance(x, dict):
        return _check_array(x, what, source)
    x = {k: _check_array(v, f"{what}:{k}", source) for k, v in x.items()}
    counts = {k: len(v) for k, v in x.items()}
    if len(set(counts.values())) > 1:
        (a, na), (b, nb) = sorted(counts.items(), key=lambda kv: kv[1])[:: len(counts) - 1]
        raise DataError(
            f"{source}: {what}:{a} has {na} samples but {what}:{b} has {nb}.", "Give every input the same samples."
        )
    return x


SPLIT_SEED = 0  # the 80/20 split is random, and the same every run
TEST_FRACTION = 0.2
HANDFUL = 5  # fewer test samples than this of a class make its share of the accuracy a guess


def _classes(y: Labels | None) -> np.ndarray | None:
    """The labels as class ids, when they are classes: one integer per sample, or 0/1 stored as floats
    (labels per output: the first that are). None for values, one-hot rows or no labels."""
    for a in (y.values() if isinstance(y, dict) else [y]) if y is not None else []:
        a = np.asarray(a)
        if a.ndim != 1 or not len(a) or not np.issubdtype(a.dtype, np.number) or a.dtype == np.bool_:
            continue
        if np.issubdtype(a.dtype, np.integer) or set(np.unique(a).tolist()) <= {0.0, 1.0}:
            return a
    return None


def _stratified(classes: np.ndarray, n_test: int, rng: np.random.Generator) -> np.ndarray:
    """Test indices: each class's share of the test split as its share of the data (largest remainders
    rounding the counts to n_test), drawn at random within the class."""
    values, counts = np.unique(classes, return_counts=True)
    quota = counts * n_test / len(classes)
    take_n = np.floor(quota).astype(int)
    for i in np.argsort(-(quota - take_n), kind="stable")[: n_test - take_n.sum()]:
        take_n[i] += 1
    picked = [rng.permutation(np.flatnonzero(classes == v))[:k] for v, k in zip(values, take_n)]
    return np.sort(np.concatenate(picked)) if picked else np.array([], int)


def _split(x: Inputs, y: Labels | None, test_fraction: float = TEST_FRACTION):
    """80/20 into train and test, at random (seeded), within each class where the labels are classes, so a
    file sorted by class still tests on every class; with fewer than 5 samples every split holds them all.
    Returns (x_train, y_train, x_test, y_test, how)."""
    n = count(x)
    if n < 5:
        return x, y, x, y, "all"
    n_test = max(1, int(n * test_fraction))
    rng = np.random.default_rng(SPLIT_SEED)
    classes = _classes(y)
    if classes is not None:
        test, how = _stratified(classes, n_test, rng), "stratified"
    else:
        test, how = np.sort(rng.choice(n, n_test, replace=False)), "shuffled"
    is_test = np.zeros(n, bool)
    is_test[test] = True
    train = np.flatnonzero(~is_test)

    def cut(a, idx):
        if a is None:
            return None
        return {k: v[idx] for k, v in a.items()} if isinstance(a, dict) else a[idx]

    return cut(x, train), cut(y, train), cut(x, test), cut(y, test), how


def test_sample(ds: Dataset, n: int | None, why: str = "") -> tuple[Dataset, TestSample]:
    """The data with its test split cut to `n` samples (None, or at least the split: all of it), and the record
    of what was measured. The cut is stratified where the test labels are classes (each class at its share of
    the split, random within it), else random; seeded, so every candidate is measured on the same samples,
    whatever order the file holds them in (a split sorted by class loses no class). Never the first n."""
    total = count(ds.x_test)
    if n is None or n >= total:
        return ds, TestSample(samples=total, of=total)
    rng = np.random.default_rng(SPLIT_SEED)
    classes = _classes(ds.y_test)
    if classes is not None and len(classes) == total:
        idx, method = _stratified(classes, n, rng), "stratified"
    else:
        idx, method = np.sort(rng.choice(total, n, replace=False)), "shuffled"
    y = ds.y_test
    y = {k: v[idx] for k, v in y.items()} if isinstance(y, dict) else (None if y is None else y[idx])
    cut = replace(ds, x_test=take(ds.x_test, idx), y_test=y)
    return cut, TestSample(samples=len(idx), of=total, method=method, why=why)


def describe_split(how: str, train: Inputs | None, y_train, test: Inputs, y_test) -> Split:
    """The split's record: its method, sizes, samples per class in the test split, and what makes the
    test split a poor measure of accuracy (one class only; fewer than a handful of some class)."""
    classes = _classes(y_test) if y_test is not None else None
    known = _classes(y_train) if y_train is not None else None
    seen = set() if known is None else {_class_name(v) for v in np.unique(known)}
    counts: dict[str, int] = {}
    if classes is not None:
        values, n = np.unique(classes, return_counts=True)
        counts = {_class_name(v): int(k) for v, k in zip(values, n)}
    return Split(
        method=how,
        seed=SPLIT_SEED if how in ("stratified", "shuffled") else None,
        train=count(train) if train is not None else 0,
        test=count(test),
        test_classes=counts,
        warnings=_split_warnings(counts, seen),
    )


def _split_warnings(counts: dict[str, int], seen: set[str]) -> list[str]:
    """What makes a test split (its samples per class, `counts`; the training split's classes, `seen`) a
    poor measure: one class only, classes it lacks, fewer than a handful of samples of some."""
    if not counts:
        return []
    if len(counts) == 1:
        ((only, k),) = counts.items()
        return [f"test split of one class ({only}; {k} sample{'' if k == 1 else 's'}): accuracy measures it alone"]
    warnings = []
    missing = sorted(seen - set(counts), key=_class_key)
    if missing:
        warnings.append(
            f"test split lacks {len(missing)} class(es) the training split has ({_listed(missing)}): "
            "accuracy says nothing of them"
        )
    few = {c: k for c, k in counts.items() if k < HANDFUL}
    if few:
        shown = _listed([f"{c}: {k}" for c, k in sorted(few.items(), key=lambda ck: _class_key(ck[0]))])
        warnings.append(
            f"test split has under {HANDFUL} samples of {len(few)} of its {len(counts)} classes ({shown}): "
            "a rough accuracy"
        )
    return warnings


def _class_name(v) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


def _class_key(name: str):
    try:
        return (0, float(name))
    except ValueError:
        return (1, name)


def _listed(items: list[str], most: int = 6) -> str:
    return ", ".join(items[:most]) + (f", ... {len(items) - most} more" if len(items) > most else "")


_WARNED: set[str] = set()


def warn_split(ds: Dataset | None) -> None:
    """Say on screen (once per data set and process) what makes its test split a poor measure."""
    if ds is None or ds.split is None or not ds.split.warnings:
        return
    key = f"{ds.source}|{ds.fingerprint}"
    if key in _WARNED:
        return
    _WARNED.add(key)
    for w in ds.split.warnings:
        log.warning("%s: %s.", Path(ds.source).name, w)


def say_once(notes: list[str]) -> None:
    """Say each note on screen once per process (a data fact every command that reads the file repeats)."""
    for note in notes:
        if note not in _WARNED:
            _WARNED.add(note)
            log.warning("%s.", note)


def _same_count(xs: Inputs | None, ys: Labels | None, name: str, source: str) -> None:
    if xs is None or ys is None:
        return
    for label, y in ys.items() if isinstance(ys, dict) else [("", ys)]:
        if count(xs) != len(y):
            tag = f"y_{name}:{named(label)}" if label else f"y_{name}"
            raise DataError(
                f"{source}: x_{name} has {count(xs)} samples but {tag} has {len(y)}.", "Give one label per sample."
            )


def from_arrays(
    x=None,
    y=None,
    x_train=None,
    y_train=None,
    x_test=None,
    y_test=None,
    x_cal=None,
    source="arrays",
    calibration_seed: int = 0,
    class_names: tuple[str, ...] = (),
) -> Dataset:
    """Build a Dataset from arrays (or dicts of them keyed by input/output name), splitting x/y 80/20
    into train/test when no split is given."""
    parts = {
        k: _checked(v, k, source)
        for k, v in dict(x=x, y=y, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test, x_cal=x_cal).items()
    }
    x, y, x_train, y_train, x_test, y_test, x_cal = (
        parts[k] for k in ("x", "y", "x_train", "y_train", "x_test", "y_test", "x_cal")
    )
    how = "given"
    if x is not None:
        if x_train is not None or x_test is not None:
            raise DataError(f"{source} has both x and x_train/x_test.", "Give either x/y or an explicit split.")
        _same_count(x, y, "", source)
        x_train, y_train, x_test, y_test, how = _split(x, y)
    if x_test is None and x_train is None and x_cal is None:
        raise DataError(f"{source} has no x, x_train, x_test or x_cal array.", "Add the model inputs as array x.")
    _same_count(x_train, y_train, "train", source)
    _same_count(x_test, y_test, "test", source)
    x_cal = x_cal if x_cal is not None else (x_train if x_train is not None else x_test)
    x_test = x_test if x_test is not None else x_cal
    if count(x_cal) == 0:
        raise DataError(f"{source} has no samples.", "Add at least one sample.")
    split = describe_split(how, x_train, y_train, x_test, y_test)
    return Dataset(
        x_train, y_train, x_cal, x_test, y_test, source, calibration_seed, split=split, class_names=tuple(class_names)
    )


def combine(data: Dataset | None, calibration: Dataset | None) -> Dataset | None:
    """Test/train data from one file and calibration samples from another; either alone serves both."""
    if calibration is None:
        return data
    if data is None:
        return calibration
    return replace(data, x_cal=calibration.x_cal, source=f"{data.source} (calibration: {calibration.source})")


def coverage(ds: Dataset, n: int) -> dict[str, float]:
    """Per input: the share of test values outside the range the calibration samples cover.

    A large share means int8 will clip test inputs (a trend beyond the training range, unnormalised data).
    """
    cal, test = as_float(take(ds.x_cal, ds.calibration_index(n))), as_float(ds.x_test)
    pairs = [(k, cal[k], test[k]) for k in cal] if isinstance(cal, dict) else [("x", cal, test)]
    return {k: float(((t < c.min()) | (t > c.max())).mean()) for k, c, t in pairs}
