"""TFLite metadata written into a shipped .tflite, in the ecosystem's own format, and read back (issue 43).

The format is the one Android's Task Library, MediaPipe Tasks and tflite-support's MetadataDisplayer read: a
`ModelMetadata` flatbuffer (schema `metadata_schema.fbs`, file identifier M001) held in one of the model's
buffers, named `TFLITE_METADATA` in the model's metadata list; files it names (labels.txt) are packed as a zip
archive appended to the model, as tflite-support's MetadataPopulator packs them (the flatbuffer ignores
trailing bytes; a zip reader finds the archive from the end). The maintained writers (tflite-support, mediapipe)
pin an old protobuf that TensorFlow 2.21 cannot live with, so the flatbuffer is built with the code flatc
generates from the schema itself (`metadata_schema_generated.py`, see its header) and the flatbuffers runtime
optimize already uses.

What is written comes from the file's own I/O contract (`optimize.models.contract`): per input its dtype and
shape, scale and zero point, the value range (as `stats`), and for an image input the normalisation that maps
0..255 pixels onto the range the model expects (`NormalizationOptions`: (pixel - mean) / std), with its colour
space; per output the same, with the class names as `labels.txt` (TENSOR_AXIS_LABELS) when they are given.
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass

import numpy as np

from optimize.core.results import IOContract, TensorContract
from optimize.models import metadata_schema_generated as md

NAME = "TFLITE_METADATA"  # the metadata entry the Task Library and MediaPipe Tasks look for
IDENTIFIER = b"M001"  # metadata_schema.fbs's file_identifier
#: Every field written here is in the schema since 1.0.0 (its "Added in" notes name later ones); a reader
#: older than this version refuses the metadata, so the lowest that holds what is written.
MIN_PARSER_VERSION = "1.0.0"
AUTHOR = "optimize"
LABELS_FILE = "labels.txt"
#: Input ranges a model commonly expects from 0..255 pixels: a data range within 2% of one is taken as it.
_CONVENTIONS = ((0.0, 1.0), (-1.0, 1.0), (0.0, 255.0), (-0.5, 0.5))


@dataclass(frozen=True)
class About:
    """What the metadata says besides the contract: the model's name, one description, the class names."""

    name: str
    description: str
    labels: tuple[str, ...] = ()


def _image(t: TensorContract) -> int | None:
    """The colour space of an image input ([1, H, W, 1] grayscale or [1, H, W, 3] RGB), else None."""
    s = t.shape
    if len(s) == 4 and s[-1] in (1, 3) and s[1] > 1 and s[2] > 1:
        return md.ColorSpaceType.GRAYSCALE if s[-1] == 1 else md.ColorSpaceType.RGB
    return None


def normalization(low: float, high: float) -> tuple[float, float]:
    """(mean, std) with (pixel - mean) / std mapping 0..255 onto [low, high]: [0, 1] is (0, 255), [-1, 1] is
    (127.5, 127.5). A range within 2% of a common convention is taken as that convention."""
    width = high - low
    for lo, hi in _CONVENTIONS:
        if width > 0 and abs(low - lo) <= 0.02 * (hi - lo) and abs(high - hi) <= 0.02 * (hi - lo):
            low, high, width = lo, hi, hi - lo
            break
    std = 255.0 / width
    return -low * std + 0.0, std  # + 0.0: a mean of 0 written as 0, not -0


def _content(t: TensorContract):
    content = md.ContentT()
    space = _image(t)
    if space is None:
        content.contentPropertiesType = md.ContentProperties.FeatureProperties
        content.contentProperties = md.FeaturePropertiesT()
    else:
        image = md.ImagePropertiesT()
        image.colorSpace = space
        content.contentPropertiesType = md.ContentProperties.ImageProperties
        content.contentProperties = image
    return content


def _describe(t: TensorContract, feeding: bool) -> str:
    shape = "x".join("?" if d < 0 else str(d) for d in t.shape)
    text = f"{t.dtype} [{shape}]"
    if t.scale is not None:
        how = "q = round(x / scale) + zero_point" if feeding else "x = (q - zero_point) * scale"
        text += f", scale {t.scale:.8g}, zero point {t.zero_point}: {how}"
    if t.range is not None:
        text += f"; values in [{t.range[0]:g}, {t.range[1]:g}]" + (" (the data's range)" * (t.range_from == "data"))
    return text


def _tensor(t: TensorContract, feeding: bool, labels: tuple[str, ...] = ()):
    m = md.TensorMetadataT()
    m.name, m.description, m.content = t.name, _describe(t, feeding), _content(t)
    if t.range is not None:
        stats = md.StatsT()
        stats.min, stats.max = [float(t.range[0])], [float(t.range[1])]
        m.stats = stats
        if feeding and _image(t) is not None:
            options = md.NormalizationOptionsT()
            mean, std = normalization(*t.range)
            options.mean, options.std = [mean], [std]
            unit = md.ProcessUnitT()
            unit.optionsType, unit.options = md.ProcessUnitOptions.NormalizationOptions, options
            m.processUnits = [unit]
    if labels:
        f = md.AssociatedFileT()
        f.name, f.type = LABELS_FILE, md.AssociatedFileType.TENSOR_AXIS_LABELS
        f.description = "The class names, one per line, in the order of the output's last axis."
        m.associatedFiles = [f]
    return m


def _labelled_output(contract: IOContract, labels: tuple[str, ...]) -> int | None:
    """The first output whose last axis has one entry per class name."""
    for i, t in enumerate(contract.outputs):
        if labels and t.shape and t.shape[-1] == len(labels):
            return i
    return None


def build(contract: IOContract, about: About) -> bytes:
    """The ModelMetadata flatbuffer for a file with this contract."""
    at = _labelled_output(contract, about.labels)
    sg = md.SubGraphMetadataT()
    sg.inputTensorMetadata = [_tensor(t, True) for t in contract.inputs]
    sg.outputTensorMetadata = [
        _tensor(t, False, about.labels if i == at else ()) for i, t in enumerate(contract.outputs)
    ]
    m = md.ModelMetadataT()
    m.name, m.description, m.author = about.name, about.description, AUTHOR
    m.minParserVersion, m.subgraphMetadata = MIN_PARSER_VERSION, [sg]
    import flatbuffers

    b = flatbuffers.Builder(1024)
    b.Finish(m.Pack(b), file_identifier=IDENTIFIER)
    return bytes(b.Output())


def files_for(contract: IOContract, about: About) -> dict[str, bytes]:
    """The files the metadata names, to pack with the model: labels.txt when an output takes the labels."""
    if _labelled_output(contract, about.labels) is None:
        return {}
    return {LABELS_FILE: ("\n".join(about.labels) + "\n").encode()}


def embed(content: bytes, metadata: bytes, files: dict[str, bytes]) -> bytes:
    """The model with `metadata` as its TFLITE_METADATA entry (replacing one it held: a quantized copy of a
    float model carries the float model's) and `files` packed after it as a zip archive."""
    from optimize.models.normalize import _load, _save, _schema

    s = _schema()
    model = _load(content, copy=False)  # weights only written out again: views of `content`, not a copy
    buf = s.BufferT()
    buf.data = np.frombuffer(metadata, np.uint8)
    model.buffers = list(model.buffers or [])
    old = _own_buffer(model)
    if old is None:
        model.buffers.append(buf)
    else:  # the one it held is overwritten, not left behind: the same bytes whether or not it held one
        model.buffers[old] = buf
    entry = s.MetadataT()
    entry.name, entry.buffer = NAME, len(model.buffers) - 1 if old is None else old
    model.metadata = [m for m in (model.metadata or []) if _text(m.name) != NAME] + [entry]
    flat = _save(model)
    del model
    if not files:
        return flat
    archive = _After(len(flat))
    with zipfile.ZipFile(archive, "w") as z:  # as appended to `flat` ("a"), without a copy of the model to append to
        for name, data in files.items():
            z.writestr(name, data)
    return flat + archive.getvalue()


class _After(io.BytesIO):
    """A zip archive written apart from the model it will follow: its positions (`tell`, `seek`) count from the
    model's start, `shift` bytes before the archive's own, so its offsets are those of the joined file."""

    def __init__(self, shift: int) -> None:
        super().__init__()
        self.shift = shift

    def tell(self) -> int:
        return super().tell() + self.shift

    def seek(self, pos: int, whence: int = 0) -> int:
        return super().seek(pos - self.shift if whence == 0 else pos, whence) + self.shift


def _own_buffer(model) -> int | None:
    """The buffer of the model's TFLITE_METADATA entry when nothing else reads it (no tensor, no other entry)."""
    mine = [m.buffer for m in (model.metadata or []) if _text(m.name) == NAME]
    if not mine or not 0 < mine[0] < len(model.buffers):
        return None
    used = {t.buffer for g in model.subgraphs or [] for t in g.tensors or []}
    used |= {m.buffer for m in model.metadata or [] if _text(m.name) != NAME}
    return None if mine[0] in used else mine[0]


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v or "")


def _metadata_buffer(content: bytes) -> bytes | None:
    """The TFLITE_METADATA buffer's bytes, read with the .tflite schema's own reader; None: the file has none."""
    from optimize.models.flatbuffer import _schema

    s = _schema()
    m = s.Model.GetRootAs(content, 0)
    for i in range(m.MetadataLength()):
        entry = m.Metadata(i)
        if _text(entry.Name()) == NAME:
            b = m.Buffers(entry.Buffer())
            if b.DataLength():
                return b.DataAsNumpy().tobytes()
            off, size = b.Offset(), b.Size()
            return bytes(content[off : off + size]) if off > 1 else None
    return None


def read(content: bytes):
    """The file's ModelMetadata, unpacked by the schema's generated reader (`ModelMetadataT`), or None."""
    data = _metadata_buffer(content)
    if data is None or not md.ModelMetadata.ModelMetadataBufferHasIdentifier(data, 0):
        return None
    return md.ModelMetadataT.InitFromObj(md.ModelMetadata.GetRootAs(data, 0))


#: Files packed with a model are labels and vocabularies: larger members, or more of them, are not read.
MAX_PACKED_BYTES, MAX_PACKED_FILES = 16 * 2**20, 64


def _members(source) -> dict[str, bytes]:
    """The members of the zip archive at the end of `source` (bytes or a path), each checked before it is read
    (size, compression ratio: `core.bounded`); an archive that is not a plain set of small files gives none."""
    from optimize.core.bounded import read_member
    from optimize.core.errors import OptimizeError

    try:
        if not zipfile.is_zipfile(source):
            return {}
        with zipfile.ZipFile(source) as z:
            names = z.namelist()
            if len(names) > MAX_PACKED_FILES:
                return {}
            return {n: read_member(z, n, MAX_PACKED_BYTES) for n in names}
    except (OSError, zipfile.BadZipFile, OptimizeError, RuntimeError, NotImplementedError, EOFError):
        return {}


def packed(content: bytes) -> dict[str, bytes]:
    """The files packed after the model (its appended zip archive), by name."""
    return _members(io.BytesIO(content))


def packed_file(path) -> dict[str, bytes]:
    """The files packed after the model in a .tflite on disk (only the archive's directory and members are read)."""
    return _members(path)


def summary(content: bytes) -> str | None:
    """What TFLite metadata the file carries, in a line read back from it (None: none)."""
    meta = read(content)
    if meta is None:
        return None
    said = []
    for sg in meta.subgraphMetadata or []:
        for t in sg.inputTensorMetadata or []:
            if any(u.optionsType == md.ProcessUnitOptions.NormalizationOptions for u in t.processUnits or []):
                said.append(f"normalisation of {_text(t.name)}")
    files = packed(content)
    said += [f"{n} ({len(files[n].splitlines())} lines)" for n in files]
    by = _text(meta.author) or "unknown"
    return f"{NAME} (by {by}, parser {_text(meta.minParserVersion) or '?'}): " + ", ".join(
        ["name", "description", *said]
    )
