"""Seeded detectors of each layout, built here (no downloads): an SSD ending in the real
`TFLite_Detection_PostProcess` custom op, an end-to-end [1, K, 6] head (a PyTorch module, for .pt2 and ONNX),
and photos to run them on. Used by the tests and by benchmarks/bench_detect.py.

The SSD's post-processing op is emitted by TensorFlow's converter from a tf.function that declares, through
`experimental_implements`, the op's name and attributes (anchors' scales, score threshold, detections kept,
NMS IoU), with custom ops allowed: the way the TF Object Detection API's TF2 export writes it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

CLASSES = 3
ANCHORS_PER_CELL = 4
MAX_DETECTIONS = 10


def photos(n: int, side: int, seed: int = 0) -> np.ndarray:
    """n photos from scikit-image (colour photos, then LFW faces), resized to side x side, 0..1 floats; `seed`
    shifts which crops are taken, so two seeds give two splits."""
    from skimage import data, transform

    colour = [data.astronaut(), data.chelsea(), data.coffee(), data.rocket(), data.cat(), data.retina()]
    faces = [np.repeat(f[..., None], 3, -1) for f in data.lfw_subset()]
    pool = colour + faces
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        im = pool[(i + 7 * seed) % len(pool)].astype(np.float32)
        im = im / 255.0 if im.max() > 1.5 else im
        h, w = im.shape[:2]
        ch, cw = int(h * rng.uniform(0.6, 1.0)), int(w * rng.uniform(0.6, 1.0))
        y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
        out.append(transform.resize(im[y : y + ch, x : x + cw], (side, side), anti_aliasing=True))
    return np.stack(out).astype(np.float32)


def _anchors(cells: int) -> np.ndarray:
    """[cells * cells * A, 4] anchors (ycentre, xcentre, h, w), as the op reads them."""
    ys, xs = np.meshgrid((np.arange(cells) + 0.5) / cells, (np.arange(cells) + 0.5) / cells, indexing="ij")
    n = cells * cells
    sizes = np.array([[0.2, 0.3], [0.3, 0.2], [0.4, 0.5], [0.5, 0.4]], np.float32)
    return np.stack(
        [
            np.repeat(ys.ravel(), ANCHORS_PER_CELL),
            np.repeat(xs.ravel(), ANCHORS_PER_CELL),
            np.tile(sizes[:, 0], n),
            np.tile(sizes[:, 1], n),
        ],
        1,
    ).astype(np.float32)


def _signature(attrs: dict) -> str:
    """The `experimental_implements` text naming the custom op and its attributes (a NameAttrList)."""
    parts = ['name: "TFLite_Detection_PostProcess"']
    for key, v in attrs.items():
        value = f"b: {str(v).lower()}" if isinstance(v, bool) else (f"i: {v}" if isinstance(v, int) else f"f: {v}")
        parts.append(f'attr {{ key: "{key}" value {{ {value} }} }}')
    return " ".join(parts)


def ssd_postprocessed(
    folder: Path, side: int = 64, threshold: float = 0.55, seed: int = 0, postprocess: bool = True
) -> Path:
    """A seeded SSD-style detector (a small conv backbone, box and class heads on an 8 x 8 grid of anchors)
    ending in the real TFLite_Detection_PostProcess op: outputs boxes [1, 10, 4], classes [1, 10], scores
    [1, 10], count [1]. `postprocess` False: the same detector as a raw pair, decoded corners [1, N, 4] beside
    class scores [1, N, C] (no background column). Returns the float32 .tflite."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)

    def w(*shape):
        return tf.constant(rng.normal(0, 1.4 / np.sqrt(np.prod(shape[:-1])), shape).astype(np.float32))

    cells = 8
    a = ANCHORS_PER_CELL
    w1, w2, w3 = w(3, 3, 3, 16), w(3, 3, 16, 32), w(3, 3, 32, 48)
    wb, wc = w(1, 1, 48, a * 4), w(1, 1, 48, a * (CLASSES + 1))
    bias = tf.constant(np.tile(np.r_[-1.0, np.full(CLASSES, -2.0)], a).astype(np.float32))
    anchors = tf.constant(_anchors(cells))
    attrs = {
        "max_detections": MAX_DETECTIONS,
        "max_classes_per_detection": 1,
        "num_classes": CLASSES,
        "nms_score_threshold": threshold,
        "nms_iou_threshold": 0.5,
        "y_scale": 10.0,
        "x_scale": 10.0,
        "h_scale": 5.0,
        "w_scale": 5.0,
        "use_regular_nms": False,
        "detections_per_class": 100,
    }

    @tf.function(experimental_implements=_signature(attrs))
    def post(boxes, scores, anchors):  # a stand-in body: the converter puts the custom op in its place
        return tf.zeros([1, 10, 4]), tf.zeros([1, 10]), tf.zeros([1, 10]), tf.zeros([1])

    @tf.function(input_signature=[tf.TensorSpec([1, side, side, 3], tf.float32)])
    def detect(x):
        h = tf.nn.relu(tf.nn.conv2d(x, w1, 2, "SAME"))
        h = tf.nn.relu(tf.nn.conv2d(h, w2, 2, "SAME"))
        h = tf.nn.relu(tf.nn.conv2d(h, w3, side // cells // 4, "SAME"))
        boxes = tf.reshape(tf.nn.conv2d(h, wb, 1, "SAME"), [1, -1, 4])
        scores = tf.sigmoid(tf.reshape(3 * tf.nn.conv2d(h, wc, 1, "SAME") + bias, [1, -1, CLASSES + 1]))
        if not postprocess:  # decoded as the op decodes them: centre offsets / 10, sizes exp(/ 5)
            centre = anchors[None, :, :2] + boxes[..., :2] / 10 * anchors[None, :, 2:]
            size = anchors[None, :, 2:] * tf.exp(boxes[..., 2:] / 5)
            return tf.concat([centre - size / 2, centre + size / 2], -1), scores[..., 1:]
        return post(boxes, scores, anchors)

    module = tf.Module()
    module.detect = detect
    saved = folder / f"ssd_savedmodel_{int(postprocess)}"
    tf.saved_model.save(module, str(saved), signatures=detect.get_concrete_function())
    conv = tf.lite.TFLiteConverter.from_saved_model(str(saved))
    conv.allow_custom_ops = True
    path = folder / ("ssd.tflite" if postprocess else "ssd_pair.tflite")
    path.write_bytes(conv.convert())
    return path


def end2end_module(side: int = 64, classes: int = CLASSES, k: int = 20, seed: int = 0):
    """A seeded PyTorch detector whose head selects its own rows: a conv backbone, a raw head of N anchors
    (boxes in pixels, class scores), then the top K by score gathered: [1, K, 6] (x1, y1, x2, y2, score,
    class id), as YOLOv10 / YOLO11 end2end exports give them."""
    import torch
    from torch import nn

    torch.manual_seed(seed)

    class EndToEnd(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU(), nn.Conv2d(16, 32, 3, 2, 1), nn.ReLU(), nn.Conv2d(32, 32, 3, 2, 1)
            )  # fmt: skip
            self.box = nn.Conv2d(32, 4, 1)
            self.cls = nn.Conv2d(32, classes, 1)
            cells = side // 8
            ys, xs = torch.meshgrid(torch.arange(cells), torch.arange(cells), indexing="ij")
            grid = torch.stack([xs.flatten(), ys.flatten()], 1).float() * 8 + 4
            self.register_buffer("grid", grid)

        def forward(self, x):
            h = torch.relu(self.body(x))
            box = self.box(h).flatten(2).transpose(1, 2)  # [1, N, 4]
            centre = self.grid[None] + 8 * torch.tanh(box[..., :2])
            size = 6 + 10 * torch.sigmoid(box[..., 2:])
            corners = torch.cat([centre - size / 2, centre + size / 2], -1)
            scores = torch.sigmoid(self.cls(h).flatten(2).transpose(1, 2) * 53 - 8.7)  # [1, N, C], spread
            best, cls = scores.max(-1)
            top, idx = best.topk(k, dim=1)
            picked = torch.gather(corners, 1, idx[..., None].expand(-1, -1, 4))
            label = torch.gather(cls, 1, idx).float()
            return torch.cat([picked, top[..., None], label[..., None]], -1)

    return EndToEnd().eval()
